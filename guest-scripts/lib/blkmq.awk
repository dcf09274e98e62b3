# blkmq.awk - the "blk_mq" object of the result document (docs/lab-protocol.md,
# section 3): blk-mq's debugfs attributes of every hardware queue, before and
# after a variant. Functions only, used by result.awk:
#
#   awk -f json.awk -f cpu.awk -f blkmq.awk -f result.awk
#
# run.sh's snapshot has one section per attribute file it could read:
#   @blkmq DEV HCTX ATTR      (e.g. "@blkmq vda hctx0 dispatch_busy")
# followed by the content of /sys/kernel/debug/block/DEV/HCTX/ATTR. Which
# attributes exist depends on the kernel (5.10 has dispatched, queued and run;
# 6.1 only run; 6.12 none of the three); an attribute missing from either
# snapshot is null, never an error. Counters (dispatched, queued, run) become
# deltas; gauges (dispatch_busy, active, the tag state) are reported as
# {"before": …, "after": …}.
# POSIX awk only.

# Call with the section name (without "@") and each following line.
function blkmq_section(side, sec,    w, n) {
    n = split(sec, w, " ")
    if (n != 4 || w[1] != "blkmq" || w[3] !~ /^hctx[0-9]+$/) { _bq_attr = ""; return }
    _bq_dev = w[2]; _bq_h = substr(w[3], 5) + 0; _bq_attr = w[4]; _bq_sub = ""
    if (!((_bq_dev, _bq_h) in BQ_HSEEN)) { BQ_HSEEN[_bq_dev, _bq_h] = 1; BQ_NH[_bq_dev]++; BQ_H[_bq_dev, BQ_NH[_bq_dev]] = _bq_h }
    BQ_HAS[side, _bq_dev, _bq_h, _bq_attr] = 1
    BQ_ANY[side, _bq_dev, _bq_h] = 1
    if (!(_bq_attr in BQ_ATTRSEEN)) BQ_ATTRSEEN[_bq_attr] = 1
}

function blkmq_line(side, line,    f, nf, k, v, key) {
    if (_bq_attr == "") return
    key = side SUBSEP _bq_dev SUBSEP _bq_h SUBSEP _bq_attr
    nf = split(line, f, " ")
    if (_bq_attr == "dispatched") {
        # "%8u\t%lu" per bucket, the last "%8u+\t%lu": requests queued to the
        # driver by one blk_mq_dispatch_rq_list call
        if (nf == 2 && f[1] ~ /^[0-9]+\+?$/ && f[2] ~ /^[0-9]+$/) {
            if (!((_bq_dev, _bq_h, f[1]) in BQ_BSEEN)) {
                BQ_BSEEN[_bq_dev, _bq_h, f[1]] = 1
                BQ_NB[_bq_dev, _bq_h]++
                BQ_B[_bq_dev, _bq_h, BQ_NB[_bq_dev, _bq_h]] = f[1]
            }
            BQ_V[key, f[1]] = f[2]
        }
    } else if (_bq_attr == "tags" || _bq_attr == "sched_tags") {
        # nr_tags=, nr_reserved_tags=, active_queues=, then "bitmap_tags:"
        # (sbitmap_queue_show: depth=, busy=, wake_batch=, ws_active=, …),
        # then "breserved_tags:" (not read)
        if (line ~ /^[a-z_]+:$/) { _bq_sub = line; return }
        if (_bq_sub != "" && _bq_sub != "bitmap_tags:") return
        if (line !~ /^[a-z_]+=-?[0-9]+$/) return
        k = substr(line, 1, index(line, "=") - 1)
        v = substr(line, index(line, "=") + 1)
        if (k == "nr_tags" || k == "nr_reserved_tags" || k == "active_queues" || \
            k == "depth" || k == "busy" || k == "wake_batch" || k == "ws_active")
            BQ_V[key, k] = v
    } else if (nf == 1 && f[1] ~ /^-?[0-9]+$/) {
        BQ_V[key, "value"] = f[1]
    }
}

# the number of an attribute on both sides: "" when either lacks it
function _bq_both(dev, h, attr, k) {
    if (!((0, dev, h, attr, k) in BQ_V) || !((1, dev, h, attr, k) in BQ_V)) return ""
    return 1
}

function _bq_counter(dev, h, attr,    d) {
    if (_bq_both(dev, h, attr, "value") == "") return "null"
    d = BQ_V[1, dev, h, attr, "value"] - BQ_V[0, dev, h, attr, "value"]
    _bq_add(dev, attr, d)
    return int0(d)
}

function _bq_gauge(dev, h, attr) {
    if (_bq_both(dev, h, attr, "value") == "") return "null"
    return "{\"before\": " int0(BQ_V[0, dev, h, attr, "value"]) ", \"after\": " int0(BQ_V[1, dev, h, attr, "value"]) "}"
}

function _bq_dispatched(dev, h,    out, i, b, n, d) {
    n = BQ_NB[dev, h] + 0
    for (i = 1; i <= n; i++)
        if (_bq_both(dev, h, "dispatched", BQ_B[dev, h, i]) == "") return "null"
    out = ""
    for (i = 1; i <= n; i++) {
        b = BQ_B[dev, h, i]
        d = BQ_V[1, dev, h, "dispatched", b] - BQ_V[0, dev, h, "dispatched", b]
        _bq_add(dev, "dispatched" SUBSEP b, d)
        if (!(b in BQ_SUMBSEEN)) { BQ_SUMBSEEN[b] = 1; BQ_SUMB[++BQ_NSUMB] = b }
        out = out (i > 1 ? ", " : "") jstr(b) ": " int0(d)
    }
    return n ? "{" out "}" : "null"
}

function _bq_tags_side(side, dev, h, attr,    out, i, n, k, ks) {
    n = split("nr_tags nr_reserved_tags active_queues depth busy wake_batch ws_active", ks, " ")
    out = ""
    for (i = 1; i <= n; i++) {
        k = ks[i]
        if ((side, dev, h, attr, k) in BQ_V)
            out = out (out == "" ? "" : ", ") "\"" k "\": " int0(BQ_V[side, dev, h, attr, k])
    }
    return out == "" ? "" : "{" out "}"
}

function _bq_tags(dev, h, attr,    b, a) {
    b = _bq_tags_side(0, dev, h, attr); a = _bq_tags_side(1, dev, h, attr)
    if (b == "" || a == "") return "null"     # no file, or no tags (sched_tags without a scheduler)
    return "{\"before\": " b ", \"after\": " a "}"
}

# per device (dev) and over all devices (""): counter sums
function _bq_add(dev, what, d) {
    BQ_SUM[dev, what] += d; BQ_SUMHAS[dev, what] = 1
    BQ_SUM["", what] += d; BQ_SUMHAS["", what] = 1
}

function _bq_sum_json(dev,    out, i, b, n) {
    out = "{\"queued\": " (((dev, "queued") in BQ_SUMHAS) ? int0(BQ_SUM[dev, "queued"]) : "null")
    out = out ", \"run\": " (((dev, "run") in BQ_SUMHAS) ? int0(BQ_SUM[dev, "run"]) : "null")
    out = out ", \"dispatched\": "
    n = 0
    for (i = 1; i <= BQ_NSUMB; i++) {
        b = BQ_SUMB[i]
        if (!((dev, "dispatched" SUBSEP b) in BQ_SUMHAS)) continue
        out = out (n++ ? ", " : "{") jstr(b) ": " int0(BQ_SUM[dev, "dispatched" SUBSEP b])
    }
    return out (n ? "}" : "null") "}"
}

# hctx numbers of dev in numeric order, into BQ_ORD[1..n]; returns n
function _bq_order(dev,    n, i, j, t) {
    n = BQ_NH[dev] + 0
    for (i = 1; i <= n; i++) BQ_ORD[i] = BQ_H[dev, i]
    for (i = 2; i <= n; i++) {
        t = BQ_ORD[i]
        for (j = i - 1; j >= 1 && BQ_ORD[j] > t; j--) BQ_ORD[j + 1] = BQ_ORD[j]
        BQ_ORD[j + 1] = t
    }
    return n
}

# blkmq_json(devices, error): devices blank-separated, error "" or a message
function blkmq_json(devices, error,    out, nd, devs, k, dev, n, i, h, hx, attrs, na, a) {
    out = "{\"error\": " jstr_or_null(error) ", \"attributes\": ["
    na = split("dispatched queued run dispatch_busy active tags sched_tags", attrs, " ")
    n = 0
    for (i = 1; i <= na; i++)
        if (attrs[i] in BQ_ATTRSEEN) out = out (n++ ? ", " : "") jstr(attrs[i])
    out = out "],\n             \"devices\": {"
    nd = split(devices, devs, " ")
    for (k = 1; k <= nd; k++) {
        dev = devs[k]
        out = out (k > 1 ? ",\n                         " : "") jstr(dev) ": {\"hctx\": ["
        n = _bq_order(dev)
        hx = 0
        for (i = 1; i <= n; i++) {
            h = BQ_ORD[i]
            # a hardware queue present in both snapshots
            if (!((0, dev, h) in BQ_ANY) || !((1, dev, h) in BQ_ANY)) continue
            out = out (hx++ ? ",\n                   " : "\n                   ") "{\"hctx\": " h \
                  ", \"queued\": " _bq_counter(dev, h, "queued") \
                  ", \"run\": " _bq_counter(dev, h, "run") \
                  ", \"dispatched\": " _bq_dispatched(dev, h) \
                  ", \"dispatch_busy\": " _bq_gauge(dev, h, "dispatch_busy") \
                  ", \"active\": " _bq_gauge(dev, h, "active") \
                  ", \"tags\": " _bq_tags(dev, h, "tags") \
                  ", \"sched_tags\": " _bq_tags(dev, h, "sched_tags") "}"
        }
        out = out "], \"sum\": " _bq_sum_json(dev) "}"
    }
    out = out "},\n             \"sum\": " _bq_sum_json("") "}"
    return out
}
