# result.awk - the guest result document (docs/lab-protocol.md, section 3).
#
#   awk -f json.awk -f cpu.awk -f blkmq.awk -f result.awk   (no input files; all from ENVIRON)
#
# ENVIRON:
#   R_SCENARIO R_VARIANT     names
#   R_OK                     "true" or "false";  R_ERROR  message ("" -> null)
#   R_KERNEL R_NCPU          uname -r, online CPUs
#   R_CLOCKSOURCE            the clocksource at the variant's end ("" -> null)
#   R_KIND R_PARAMS R_STACK R_STACKP R_SCHED R_NR R_QDEPTH R_NOMERGES R_RQAFF R_LAYOUT
#   R_RUNTIME R_RAMP R_FIOARGS   effective settings
#   R_FIOCMD                 the whole fio command line (blank-separated words)
#   R_DEVICES                the devices fio ran on (blank-separated): the
#                            targets, or the maps of a stack
#   R_PATHS                  raw JSON object (a stack's maps: map name,
#                            selector, path devices) or ""
#   R_PATH_QUEUE             raw JSON object (the paths' queue settings) or ""
#   R_QUEUE                  raw JSON object (queue settings read back) or ""
#   R_BEFORE R_AFTER         snapshot files written by run.sh ("" -> no data)
#   R_BEFORE_EDGE R_AFTER_EDGE  the edge reads after the begin and end SYNC
#                            replies ("" -> that edge is null)
#   R_BLKMQ_ERROR            why blk-mq's debugfs could not be read ("" -> none)
#   R_MPSTAT R_FIO           files with valid JSON to embed ("" -> null)
#   R_FIO_RC                 fio's exit status ("" -> null)
#   R_FIO_LOG                file with fio's stdout/stderr ("" or empty -> null)
#
# A snapshot file is a sequence of sections, each introduced by a line
# "@NAME": @uptime, @stat, @interrupts, @softirqs, and "@block DEV" per device
# (/proc/uptime, /proc/stat, /proc/interrupts, /proc/softirqs,
# /sys/block/DEV/stat), each followed by the file's content, and
# "@blkmq DEV HCTX ATTR" per blk-mq debugfs attribute (blkmq.awk). An edge
# read has @uptime, @stat and @interrupts.
# POSIX awk only.

BEGIN {
    E_BEFORE = ENVIRON["R_BEFORE"]; E_AFTER = ENVIRON["R_AFTER"]
    have = (E_BEFORE != "" && E_AFTER != "")
    if (have) {
        have = load(E_BEFORE, 0) && load(E_AFTER, 1)
    }
    edge[0] = have && ENVIRON["R_BEFORE_EDGE"] != "" && load(ENVIRON["R_BEFORE_EDGE"], 2)
    edge[1] = have && ENVIRON["R_AFTER_EDGE"] != "" && load(ENVIRON["R_AFTER_EDGE"], 3)
    nblk = split("read_ios read_merges read_sectors read_ticks write_ios write_merges " \
                 "write_sectors write_ticks in_flight io_ticks time_in_queue discard_ios " \
                 "discard_merges discard_sectors discard_ticks flush_ios flush_ticks", BLKF, " ")

    print "{"
    print "  \"schema\": \"blklab-guest-result/1\","
    print "  \"scenario\": " jstr(ENVIRON["R_SCENARIO"]) ", \"variant\": " jstr(ENVIRON["R_VARIANT"]) ","
    print "  \"ok\": " (ENVIRON["R_OK"] == "true" ? "true" : "false") ", \"error\": " jstr_or_null(ENVIRON["R_ERROR"]) ","
    print "  \"kernel\": " jstr(ENVIRON["R_KERNEL"]) ","
    print "  \"nr_cpus\": " jnum_or_null(ENVIRON["R_NCPU"]) ","
    print "  \"clocksource\": " jstr_or_null(ENVIRON["R_CLOCKSOURCE"]) ","
    print "  \"settings\": {\"target\": " jstr(ENVIRON["R_KIND"]) ", \"target_params\": " jlist(ENVIRON["R_PARAMS"]) ", " \
          "\"stack\": " jstr_or_null(ENVIRON["R_STACK"]) ", \"stack_params\": " jlist(ENVIRON["R_STACKP"]) ", " \
          "\"sched\": " jstr_or_null(ENVIRON["R_SCHED"]) ", \"nr_requests\": " jnum_or_null(ENVIRON["R_NR"]) ", " \
          "\"queue_depth\": " jnum_or_null(ENVIRON["R_QDEPTH"]) ", \"nomerges\": " jnum_or_null(ENVIRON["R_NOMERGES"]) ", " \
          "\"rq_affinity\": " jnum_or_null(ENVIRON["R_RQAFF"]) ", \"layout\": " jstr_or_null(ENVIRON["R_LAYOUT"]) ", " \
          "\"runtime\": " jnum_or_null(ENVIRON["R_RUNTIME"]) ", \"ramp\": " jnum_or_null(ENVIRON["R_RAMP"]) ","
    print "               \"fio_args\": " jlist(ENVIRON["R_FIOARGS"]) "},"
    print "  \"fio_cmdline\": " (ENVIRON["R_FIOCMD"] == "" ? "null" : jlist(ENVIRON["R_FIOCMD"])) ","
    print "  \"devices\": " jlist(ENVIRON["R_DEVICES"]) ","
    print "  \"queue\": " (ENVIRON["R_QUEUE"] == "" ? "null" : ENVIRON["R_QUEUE"]) ","
    print "  \"paths\": " (ENVIRON["R_PATHS"] == "" ? "null" : ENVIRON["R_PATHS"]) ","
    print "  \"path_queue\": " (ENVIRON["R_PATH_QUEUE"] == "" ? "null" : ENVIRON["R_PATH_QUEUE"]) ","
    if (have) {
        print "  \"wall_seconds\": " sprintf("%.2f", UP[1] - UP[0]) ","
        print "  \"cpu\": " cpu_json() ","
        print "  \"context_switches\": " d("ctxt") ", \"processes\": " d("processes") ","
        print "  \"interrupts\": " interrupts_json() ","
        print "  \"softirqs\": " softirqs_json() ","
        print "  \"block\": " block_json() ","
        print "  \"blk_mq\": " blkmq_json(ENVIRON["R_DEVICES"], ENVIRON["R_BLKMQ_ERROR"]) ","
    } else {
        print "  \"wall_seconds\": null, \"cpu\": null, \"context_switches\": null, \"processes\": null,"
        print "  \"interrupts\": null, \"softirqs\": null, \"block\": null, \"blk_mq\": null,"
    }
    print "  \"sync_edges\": " (edge[0] || edge[1] ? "{\"begin\": " edge_json(0) ", \"end\": " edge_json(1) "}" : "null") ","
    printf "  \"mpstat\": "; embed(ENVIRON["R_MPSTAT"]); print ","
    print "  \"fio_rc\": " jnum_or_null(ENVIRON["R_FIO_RC"]) ","
    print "  \"fio_log\": " fio_log() ","
    printf "  \"fio\": "; embed(ENVIRON["R_FIO"]); print ""
    print "}"
}

# --- snapshot loading ------------------------------------------------------

function load(file, side,    line, sec, f, n, i, nc, label, sum, words, dev) {
    sec = ""
    n = 0
    while ((getline line < file) > 0) {
        n++
        if (line ~ /^@/) {
            sec = substr(line, 2)
            if (sec ~ /^block /) { dev = substr(sec, 7); sec = "block" }
            if (sec ~ /^blkmq /) { blkmq_section(side, sec); sec = "blkmq" }
            if (sec == "interrupts" || sec == "softirqs") hdr = 1
            continue
        }
        if (sec == "blkmq") { blkmq_line(side, line); continue }
        nf = split(line, f, " ")
        if (sec == "uptime") {
            UP[side] = f[1] + 0
        } else if (sec == "stat") {
            if (f[1] ~ /^cpu[0-9]+$/) {
                if (side == 0) CPU_B[f[1]] = line; else if (side == 1) CPU_A[f[1]] = line
            } else if (f[1] == "ctxt" || f[1] == "processes" || f[1] == "intr") {
                ST[side, f[1]] = f[2] + 0
            }
        } else if (sec == "interrupts") {
            if (hdr) { ncols[side] = nf; hdr = 0; continue }
            if (nf < 2) continue
            label = f[1]; sub(/:$/, "", label)
            nc = ncols[side]; sum = 0
            for (i = 2; i <= nc + 1 && i <= nf && f[i] ~ /^[0-9]+$/; i++) sum += f[i]
            if (label ~ /^[0-9]+$/) {
                words = ""
                for (; i <= nf; i++) words = words " " f[i]
                if (words !~ /virtio|scsi|nullb/) continue
                if (!((label) in IRQNAME)) { IRQNAME[label] = f[nf]; IRQORD[++nirq] = label }
                IRQ[side, label] = sum
            } else {
                if (!((label) in ARCHSEEN)) { ARCHSEEN[label] = 1; ARCHORD[++narch] = label }
                ARCH[side, label] = sum
            }
        } else if (sec == "softirqs") {
            if (hdr) { hdr = 0; continue }
            label = f[1]; sub(/:$/, "", label)
            sum = 0
            for (i = 2; i <= nf; i++) sum += f[i]
            if (!((label) in SOFTSEEN)) { SOFTSEEN[label] = 1; SOFTORD[++nsoft] = label }
            SOFT[side, label] = sum
        } else if (sec == "block") {
            BLKN[side, dev] = nf
            for (i = 1; i <= nf; i++) BLK[side, dev, i] = f[i] + 0
        }
    }
    close(file)
    return n > 0
}

function d(key) {
    return int0(ST[1, key] - ST[0, key])
}

function interrupts_json(    out, i, l, n) {
    out = "{\"total\": " d("intr") ", \"lines\": ["
    n = 0
    for (i = 1; i <= nirq; i++) {
        l = IRQORD[i]
        out = out (n++ ? ", " : "") "{\"irq\": " jstr(l) ", \"name\": " jstr(IRQNAME[l]) \
              ", \"count\": " int0(IRQ[1, l] - IRQ[0, l]) "}"
    }
    out = out "], \"arch\": {"
    for (i = 1; i <= narch; i++) {
        l = ARCHORD[i]
        out = out (i > 1 ? ", " : "") jstr(l) ": " int0(ARCH[1, l] - ARCH[0, l])
    }
    return out "}}"
}

# edge_json(e): what the guest counted between its snapshot (side e) and
# its read after the SYNC reply (side e + 2), or null without that read
function edge_json(e,    out, i, l) {
    if (!edge[e]) return "null"
    out = "{\"seconds\": " sprintf("%.2f", UP[e + 2] - UP[e]) \
          ", \"context_switches\": " int0(ST[e + 2, "ctxt"] - ST[e, "ctxt"]) \
          ", \"interrupts\": " int0(ST[e + 2, "intr"] - ST[e, "intr"]) ", \"arch\": {"
    for (i = 1; i <= narch; i++) {
        l = ARCHORD[i]
        out = out (i > 1 ? ", " : "") jstr(l) ": " int0(ARCH[e + 2, l] - ARCH[e, l])
    }
    return out "}}"
}

function softirqs_json(    out, i, l) {
    out = "{"
    for (i = 1; i <= nsoft; i++) {
        l = SOFTORD[i]
        out = out (i > 1 ? ", " : "") jstr(l) ": " int0(SOFT[1, l] - SOFT[0, l])
    }
    return out "}"
}

function block_json(    out, nd, devs, k, dev, n, i, v) {
    out = "{"
    nd = split(ENVIRON["R_DEVICES"], devs, " ")
    for (k = 1; k <= nd; k++) {
        dev = devs[k]
        out = out (k > 1 ? ",\n            " : "") jstr(dev) ": {"
        n = BLKN[1, dev]
        if (BLKN[0, dev] < n) n = BLKN[0, dev]
        if (n > nblk) n = nblk
        for (i = 1; i <= n; i++) {
            v = (BLKF[i] == "in_flight") ? BLK[1, dev, i] : BLK[1, dev, i] - BLK[0, dev, i]
            out = out (i > 1 ? ", " : "") "\"" BLKF[i] "\": " int0(v)
        }
        out = out "}"
    }
    return out "}"
}

# print the content of file (valid JSON, checked by run.sh) or null
function embed(file,    line, n) {
    n = 0
    if (file != "") {
        while ((getline line < file) > 0) {
            if (n++) printf "\n"
            printf "%s", line
        }
        close(file)
    }
    if (n == 0) printf "null"
}

function fio_log(    file, line, s, n) {
    file = ENVIRON["R_FIO_LOG"]
    if (file == "") return "null"
    s = ""; n = 0
    while ((getline line < file) > 0) {
        if (length(s) < 16384) s = s (n ? "\n" : "") line
        n++
    }
    close(file)
    return n ? jstr(s) : "null"
}
