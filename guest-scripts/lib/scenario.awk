# scenario.awk - the one parser of blklab scenario files (.scn).
#
#   SCN_FILE=path SCN_NAME=name awk -v mode=json -f json.awk -f scenario.awk FILE
#   SCN_FILE=path SCN_NAME=name awk -v mode=sh -v ncpu=N -f json.awk -f scenario.awk FILE
#
# The format is specified in docs/lab-protocol.md (section 3) and
# guest-scripts/README.md. On the first error it prints
#     BLKLAB-ERROR scenario FILE:LINE: message
# and exits 2 (FILE is $SCN_FILE as given). Otherwise:
#
#   mode=json  one JSON line, the scenario as written (globals folded into each
#              variant; no environment overrides, @NCPU@ left as is):
#              {"name","description","disks","queues","vcpus","memory",
#               "memory_per_vcpu","queue_size","kernel_append","variants":[{"name","target":{"kind",
#               "params":[...]},"stack":null|{"kind","params":[...]},"sched","nr_requests","queue_depth",
#               "nomerges","rq_affinity","device":[...],"layout","runtime",
#               "ramp","fio_args":[...]}]}
#   mode=sh    shell assignments for run.sh to eval: SCN_DESCRIPTION,
#              SCN_DISKS, SCN_QUEUES, SCN_NV and SCN_V<i>_{NAME,KIND,PARAMS,
#              STACK,STACKP,SCHED,NR,QDEPTH,NOMERGES,RQAFF,LAYOUT,RUNTIME,RAMP,FIO} for
#              the variants selected by
#              $BLKLAB_VARIANTS (all when empty), with $BLKLAB_RUNTIME and
#              $BLKLAB_RAMP applied and @NCPU@ replaced by ncpu in target
#              parameters and fio arguments. Lists are blank-separated words.
#
# POSIX awk only: runs under mawk, busybox awk and gawk --posix.

BEGIN {
    FILE = ENVIRON["SCN_FILE"]
    NAME = ENVIRON["SCN_NAME"]
    failed = 0
    nv = 0
    # globals (defaults)
    g_desc = ""; g_disks = 1; g_queues = ""
    g_runtime = 10; g_ramp = 0
    g_kind = "virtio"; g_params = ""; g_sched = ""; g_nr = ""; g_fio = ""
    g_vcpus = ""; g_memory = ""; g_mempercpu = ""; g_qsize = ""; g_append = ""
    g_qdepth = ""; g_nomerges = ""; g_rqaff = ""; g_layout = ""; g_dev = ""
    g_stack = ""; g_stackp = ""
    # device settings (values are checked by the host: lab::settings)
    ndevset = split("disk size tags depth tag_scope tag_fairness latency read_latency write_latency flush_latency latency_spin seed poll", devset_list, " ")
    devset_names = ""
    for (i = 1; i <= ndevset; i++) {
        devset[devset_list[i]] = 1
        devset_names = devset_names (i > 1 ? ", " : "") devset_list[i]
    }
    # fio options run.sh sets itself
    reserved["name"] = "the variant name"
    reserved["filename"] = "the target devices"
    reserved["runtime"] = "the runtime directive"
    reserved["ramp_time"] = "the ramp directive"
    reserved["output"] = "run.sh"
    reserved["output-format"] = "run.sh"
}

function fail(msg) {
    printf "BLKLAB-ERROR scenario %s:%d: %s\n", FILE, NR, msg
    failed = 1
    exit 2
}

function want_args(lo, hi) {
    if (NF - 1 < lo) fail($1 ": missing argument")
    if (hi >= 0 && NF - 1 > hi) fail($1 ": too many arguments")
}

# an unsigned decimal integer >= min (and <= max when max > 0; at most 9 digits)
function number(s, min, max,    t) {
    t = s
    sub(/^0+/, "", t)           # no octal surprises (busybox awk reads 010 as 8)
    if (t == "") t = "0"
    if (max > 0) {
        if (s !~ /^[0-9]+$/ || length(t) > 9 || t + 0 < min || t + 0 > max)
            fail($1 ": bad number '" s "' (want an integer from " min " to " max ")")
    } else if (s !~ /^[0-9]+$/ || length(t) > 9 || t + 0 < min)
        fail($1 ": bad number '" s "' (want an integer >= " min ")")
    return t + 0
}

# s as an unsigned decimal integer from min to max (at most 9 digits,
# leading zeros allowed), else ""
function decimal_in(s, min, max,    t) {
    if (s !~ /^[0-9]+$/) return ""
    t = s
    sub(/^0+/, "", t)
    if (t == "") t = "0"
    if (length(t) > 9 || t + 0 < min || t + 0 > max) return ""
    return t + 0
}

# vcpus N, host or host:MAX (N and MAX from 1 to 64): N, "host" or "host:MAX"
function vcpus_count(s,    m) {
    if (s == "host") return s
    m = s
    if (sub(/^host:/, "", m)) {
        m = decimal_in(m, 1, 64)
        if (m != "") return "host:" m
    } else {
        m = decimal_in(s, 1, 64)
        if (m != "") return m
    }
    fail("vcpus: bad count '" s "' (want an integer from 1 to 64, host, or host:MAX with MAX from 1 to 64)")
}

# memory SIZE, memory_per_vcpu SIZE: digits (not all 0) with an optional K, M, G or T
function mem_size(s, example,    t) {
    t = s
    sub(/[KMGT]$/, "", t)
    if (t !~ /^[0-9]+$/ || length(t) > 9 || t !~ /[1-9]/)
        fail($1 ": bad size '" s "' (want a number with an optional K, M, G or T suffix, e.g. " example ")")
    return s
}

function global_only() {
    if (nv > 0) fail($1 " is only allowed before the first variant")
}

# the NAME of a NAME=VALUE setting
function setting_name(s) {
    sub(/=.*/, "", s)
    return s
}

# list (blank-separated settings) with s added; an earlier one of s's name goes
function put_setting(list, s,    n, a, i, out) {
    n = split(list, a, " ")
    out = ""
    for (i = 1; i <= n; i++)
        if (setting_name(a[i]) != setting_name(s)) out = out (out == "" ? "" : " ") a[i]
    return out (out == "" ? "" : " ") s
}

# a variant's device settings: the globals it does not set, then its own
function merge_settings(global, own,    n, a, m, b, i, j, out, found) {
    n = split(global, a, " ")
    m = split(own, b, " ")
    out = ""
    for (i = 1; i <= n; i++) {
        found = 0
        for (j = 1; j <= m; j++) if (setting_name(b[j]) == setting_name(a[i])) found = 1
        if (!found) out = out (out == "" ? "" : " ") a[i]
    }
    for (j = 1; j <= m; j++) out = out (out == "" ? "" : " ") b[j]
    return out
}

function words(from,    i, s) {
    s = ""
    for (i = from; i <= NF; i++) s = s (i > from ? " " : "") $i
    return s
}

{
    sub(/\r$/, "")
    line = $0
    sub(/#.*/, "", line)
    $0 = line
    if (NF == 0) next
    d = $1
    if (d == "description") {
        global_only(); want_args(1, -1)
        g_desc = words(2)
    } else if (d == "disks") {
        global_only(); want_args(1, 1)
        g_disks = number($2, 1, 64)
    } else if (d == "queues") {
        global_only(); want_args(1, 1)
        g_queues = number($2, 1, 64)
    } else if (d == "vcpus") {
        global_only(); want_args(1, 1)
        g_vcpus = vcpus_count($2)
    } else if (d == "memory") {
        global_only(); want_args(1, 1)
        g_memory = mem_size($2, "2G")
    } else if (d == "memory_per_vcpu") {
        global_only(); want_args(1, 1)
        g_mempercpu = mem_size($2, "256M")
    } else if (d == "kernel_append") {
        global_only(); want_args(1, -1)
        g_append = words(2)
    } else if (d == "queue_size") {
        global_only(); want_args(1, 1)
        v = number($2, 1, 1024)
        t = v
        while (t > 1 && t % 2 == 0) t = t / 2
        if (t != 1) fail("queue_size: bad number '" $2 "' (want a power of two from 1 to 1024)")
        g_qsize = v
    } else if (d == "device") {
        want_args(1, -1)
        for (i = 2; i <= NF; i++) {
            if ($i !~ /^[^=]+=./) fail("device: bad setting '" $i "' (want NAME=VALUE)")
            if (!(setting_name($i) in devset))
                fail("device: unknown setting '" setting_name($i) "' (want one of " devset_names ")")
            if (nv) v_dev[nv] = put_setting(v_dev[nv], $i); else g_dev = put_setting(g_dev, $i)
        }
    } else if (d == "queue_depth") {
        want_args(1, 1)
        v = number($2, 1)
        if (nv) v_qdepth[nv] = v; else g_qdepth = v
    } else if (d == "nomerges") {
        want_args(1, 1)
        v = number($2, 0, 2)
        if (nv) v_nomerges[nv] = v; else g_nomerges = v
    } else if (d == "rq_affinity") {
        want_args(1, 1)
        v = number($2, 0, 2)
        if (nv) v_rqaff[nv] = v; else g_rqaff = v
    } else if (d == "layout") {
        want_args(1, 1)
        if ($2 != "all" && $2 != "per-disk") fail("layout: unknown layout '" $2 "' (want all or per-disk)")
        if (nv) v_layout[nv] = $2; else g_layout = $2
    } else if (d == "runtime") {
        want_args(1, 1)
        v = number($2, 1)
        if (nv) v_runtime[nv] = v; else g_runtime = v
    } else if (d == "ramp") {
        want_args(1, 1)
        v = number($2, 0)
        if (nv) v_ramp[nv] = v; else g_ramp = v
    } else if (d == "target") {
        want_args(1, -1)
        kind = $2
        if (kind == "virtio") {
            if (NF > 2) fail("target virtio takes no parameters")
        } else if (kind == "scsi_debug" || kind == "null_blk") {
            for (i = 3; i <= NF; i++)
                if ($i !~ /^[A-Za-z_][A-Za-z0-9_-]*=/)
                    fail("target: bad module parameter '" $i "' (want NAME=VALUE)")
        } else {
            fail("target: unknown kind '" kind "' (want virtio, scsi_debug or null_blk)")
        }
        p = words(3)
        if (nv) { v_kind[nv] = kind; v_params[nv] = p } else { g_kind = kind; g_params = p }
    } else if (d == "stack") {
        want_args(1, -1)
        kind = $2
        if (kind == "none") {
            if (NF > 2) fail("stack none takes no parameters")
        } else if (kind == "multipath") {
            for (i = 3; i <= NF; i++) {
                if ($i !~ /^[^=]+=./) fail("stack: bad parameter '" $i "' (want NAME=VALUE)")
                k = setting_name($i); v = substr($i, length(k) + 2)
                if (k == "selector") {
                    if (v != "service-time" && v != "round-robin" && v != "queue-length")
                        fail("stack: unknown selector '" v "' (want service-time, round-robin or queue-length)")
                } else if (k == "path_sched") {
                    if (v !~ /^[A-Za-z0-9_-]+$/) fail("stack: bad path_sched '" v "'")
                } else {
                    fail("stack: unknown parameter '" k "' (want selector or path_sched)")
                }
            }
        } else {
            fail("stack: unknown kind '" kind "' (want multipath or none)")
        }
        p = words(3)
        if (nv) { v_stack[nv] = kind; v_stackp[nv] = p } else { g_stack = kind; g_stackp = p }
    } else if (d == "sched") {
        want_args(1, 1)
        if ($2 !~ /^[A-Za-z0-9_-]+$/) fail("sched: bad name '" $2 "'")
        if (nv) v_sched[nv] = $2; else g_sched = $2
    } else if (d == "nr_requests") {
        want_args(1, 1)
        v = number($2, 1)
        if (nv) v_nr[nv] = v; else g_nr = v
    } else if (d == "fio") {
        want_args(1, -1)
        for (i = 2; i <= NF; i++) {
            opt = $i
            if (opt !~ /^--?[A-Za-z]/) continue
            sub(/^--?/, "", opt)
            sub(/=.*/, "", opt)
            if (opt in reserved)
                fail("fio: option --" opt " is set by run.sh (from " reserved[opt] ")")
        }
        a = words(2)
        if (nv) v_fio[nv] = (v_fio[nv] == "" ? "" : v_fio[nv] " ") a
        else g_fio = (g_fio == "" ? "" : g_fio " ") a
    } else if (d == "variant") {
        want_args(1, 1)
        if ($2 !~ /^[A-Za-z0-9_.-]+$/) fail("variant: bad name '" $2 "' (want [A-Za-z0-9_.-]+)")
        if ($2 in seen) fail("variant: duplicate name '" $2 "' (first at line " seen[$2] ")")
        seen[$2] = NR
        nv++
        v_name[nv] = $2
    } else {
        fail("unknown directive '" d "'")
    }
}

function shq(s) {   # single-quote s for sh
    gsub(/'/, "'\"'\"'", s)
    return "'" s "'"
}

END {
    if (failed) exit 2
    if (nv == 0) {
        if (NR == 0) NR = 1     # an empty file: report line 1
        fail("no variants (a scenario needs at least one 'variant NAME' line)")
    }
    # fold globals into variants
    for (i = 1; i <= nv; i++) {
        if (!(i in v_kind)) { v_kind[i] = g_kind; v_params[i] = g_params }
        if (!(i in v_sched)) v_sched[i] = g_sched
        if (!(i in v_stack)) { v_stack[i] = g_stack; v_stackp[i] = g_stackp }
        if (v_stack[i] == "none") { v_stack[i] = ""; v_stackp[i] = "" }
        if (!(i in v_nr)) v_nr[i] = g_nr
        if (!(i in v_qdepth)) v_qdepth[i] = g_qdepth
        if (!(i in v_nomerges)) v_nomerges[i] = g_nomerges
        if (!(i in v_rqaff)) v_rqaff[i] = g_rqaff
        if (!(i in v_layout)) v_layout[i] = (g_layout == "" ? "all" : g_layout)
        v_dev[i] = merge_settings(g_dev, v_dev[i])
        if (!(i in v_runtime)) v_runtime[i] = g_runtime
        if (!(i in v_ramp)) v_ramp[i] = g_ramp
        f = g_fio
        if (v_fio[i] != "") f = (f == "" ? "" : f " ") v_fio[i]
        v_fio[i] = f
    }
    if (mode == "json") print_json()
    else if (mode == "sh") print_sh()
    else { print "scenario.awk: mode must be json or sh"; exit 2 }
}

function print_json(    i, out) {
    out = "{\"name\":" jstr(NAME) ",\"description\":" jstr_or_null(g_desc) \
          ",\"disks\":" g_disks ",\"queues\":" jnum_or_null(g_queues) \
          ",\"vcpus\":" (g_vcpus ~ /^host/ ? jstr(g_vcpus) : jnum_or_null(g_vcpus)) \
          ",\"memory\":" jstr_or_null(g_memory) \
          ",\"memory_per_vcpu\":" jstr_or_null(g_mempercpu) \
          ",\"queue_size\":" jnum_or_null(g_qsize) \
          ",\"kernel_append\":" jstr_or_null(g_append) ",\"variants\":["
    for (i = 1; i <= nv; i++) {
        out = out (i > 1 ? "," : "") "{\"name\":" jstr(v_name[i]) \
              ",\"target\":{\"kind\":" jstr(v_kind[i]) ",\"params\":" jlist(v_params[i]) "}" \
              ",\"stack\":" (v_stack[i] == "" ? "null" : "{\"kind\":" jstr(v_stack[i]) ",\"params\":" jlist(v_stackp[i]) "}") \
              ",\"sched\":" jstr_or_null(v_sched[i]) \
              ",\"nr_requests\":" jnum_or_null(v_nr[i]) \
              ",\"queue_depth\":" jnum_or_null(v_qdepth[i]) \
              ",\"nomerges\":" jnum_or_null(v_nomerges[i]) \
              ",\"rq_affinity\":" jnum_or_null(v_rqaff[i]) \
              ",\"device\":" jlist(v_dev[i]) ",\"layout\":" jstr(v_layout[i]) \
              ",\"runtime\":" v_runtime[i] ",\"ramp\":" v_ramp[i] \
              ",\"fio_args\":" jlist(v_fio[i]) "}"
    }
    print out "]}"
}

function env_number(var, min,    s, t) {
    s = ENVIRON[var]
    if (s == "") return ""
    t = s
    sub(/^0+/, "", t)
    if (t == "") t = "0"
    if (s !~ /^[0-9]+$/ || length(t) > 9 || t + 0 < min) {
        printf "BLKLAB-ERROR %s=%s: bad number (want an integer >= %d)\n", var, s, min
        failed = 1
        exit 2
    }
    return t + 0
}

function print_sh(    rt, rp, filt, want, n, a, i, k, p, f, out) {
    rt = env_number("BLKLAB_RUNTIME", 1)
    rp = env_number("BLKLAB_RAMP", 0)
    filt = ENVIRON["BLKLAB_VARIANTS"]
    if (filt != "") {
        n = split(filt, a, ",")
        for (i = 1; i <= n; i++) if (a[i] != "") want[a[i]] = 1
    }
    out = sprintf("SCN_DESCRIPTION=%s\nSCN_DISKS=%s\nSCN_QUEUES=%s\n", shq(g_desc), g_disks, shq(g_queues))
    k = 0
    for (i = 1; i <= nv; i++) {
        if (filt != "" && !(v_name[i] in want)) continue
        k++
        p = v_params[i]; gsub(/@NCPU@/, ncpu, p)
        f = v_fio[i]; gsub(/@NCPU@/, ncpu, f)
        out = out sprintf("SCN_V%d_NAME=%s\n", k, shq(v_name[i]))
        out = out sprintf("SCN_V%d_KIND=%s\n", k, shq(v_kind[i]))
        out = out sprintf("SCN_V%d_PARAMS=%s\n", k, shq(p))
        out = out sprintf("SCN_V%d_STACK=%s\n", k, shq(v_stack[i]))
        out = out sprintf("SCN_V%d_STACKP=%s\n", k, shq(v_stackp[i]))
        out = out sprintf("SCN_V%d_SCHED=%s\n", k, shq(v_sched[i]))
        out = out sprintf("SCN_V%d_NR=%s\n", k, shq(v_nr[i]))
        out = out sprintf("SCN_V%d_QDEPTH=%s\n", k, shq(v_qdepth[i]))
        out = out sprintf("SCN_V%d_NOMERGES=%s\n", k, shq(v_nomerges[i]))
        out = out sprintf("SCN_V%d_RQAFF=%s\n", k, shq(v_rqaff[i]))
        out = out sprintf("SCN_V%d_LAYOUT=%s\n", k, shq(v_layout[i]))
        out = out sprintf("SCN_V%d_RUNTIME=%s\n", k, (rt != "" ? rt : v_runtime[i]))
        out = out sprintf("SCN_V%d_RAMP=%s\n", k, (rp != "" ? rp : v_ramp[i]))
        out = out sprintf("SCN_V%d_FIO=%s\n", k, shq(f))
    }
    if (k == 0) {
        printf "BLKLAB-ERROR %s: no variant matches BLKLAB_VARIANTS=%s\n", NAME, filt
        failed = 1
        exit 2
    }
    printf "%sSCN_NV=%d\n", out, k
}
