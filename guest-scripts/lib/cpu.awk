# cpu.awk - mpstat's reduction of two /proc/stat samples (functions only).
#
# Fill CPU_B[name] and CPU_A[name] with the "cpuN ..." lines of /proc/stat
# before and after (name = "cpu0", "cpu1", ...; the aggregate "cpu" line is
# not used), then cpu_json() returns
#   {"all":{PCT},"per_cpu":[{"cpu":0,PCT},...],"ticks":N}
# where PCT is "usr","nice","sys","iowait","irq","soft","steal","guest",
# "gnice","idle","busy" in percent with two decimals, and ticks the total
# jiffies of the window over all CPUs.
#
# This is sysstat 12's mpstat (mpstat.c get_global_cpu_mpstats,
# write_json_cpu_stats; rd_stats.c get_per_cpu_interval; common.c
# ll_sp_value):
#   - the interval of a CPU is the delta of user+nice+system+idle+iowait+irq+
#     softirq+steal (guest and guest_nice are already inside user and nice),
#     each field's delta clamped at 0, plus a correction when guest grew
#     faster than user (or guest_nice than nice);
#   - %usr = d(user-guest), %nice = d(nice-guest_nice), %sys, %iowait, %irq,
#     %soft, %steal, %guest, %gnice, %idle = d(field) / interval * 100,
#     0 for a field that went backwards; an idle value that went backwards
#     counts from 0 (CPU back from offline), an iowait value that went
#     backwards is taken as the new value (iowait moved to idle) or from 0;
#   - a CPU whose interval is 0 (tickless, no change) shows 100 % idle;
#   - "all" is the sum of the CPUs present in both samples, with those
#     corrections, over the sum of their intervals (a CPU missing from either
#     sample is left out, as mpstat leaves out an offline CPU);
#   - busy = 100 - idle (as printed, so busy + idle = 100.00 exactly).
# Rounding is printf("%.2f") of each value, like mpstat, so the ten
# components sum to 100 within +-0.05.
# POSIX awk only.

# fields: 1 user 2 nice 3 system 4 idle 5 iowait 6 irq 7 softirq 8 steal
#         9 guest 10 guest_nice (missing ones are 0)
function _cpu_fields(line, arr,    a, n, i) {
    n = split(line, a, " ")
    for (i = 1; i <= 10; i++)
        arr[i] = (i + 1 <= n) ? a[i + 1] + 0 : 0
}

function _cpu_delta(p, c) { return c >= p ? c - p : 0 }

# get_per_cpu_interval(): may adjust p[4] (idle) and p[5] (iowait)
function _cpu_interval(p, c,    ishift, iv) {
    ishift = 0
    if (c[1] >= p[1] && (c[1] - c[9]) < (p[1] - p[9]))
        ishift += (p[1] - p[9]) - (c[1] - c[9])
    if (c[2] >= p[2] && (c[2] - c[10]) < (p[2] - p[10]))
        ishift += (p[2] - p[10]) - (c[2] - c[10])
    if (c[5] < p[5]) {
        if (c[4] > p[4]) p[5] = c[5]
        else p[5] = 0
    }
    if (c[4] < p[4]) p[4] = 0
    iv = _cpu_delta(p[1], c[1]) + _cpu_delta(p[2], c[2]) + _cpu_delta(p[3], c[3]) + \
         _cpu_delta(p[5], c[5]) + _cpu_delta(p[4], c[4]) + _cpu_delta(p[8], c[8]) + \
         _cpu_delta(p[6], c[6]) + _cpu_delta(p[7], c[7])
    return iv + ishift
}

# ll_sp_value()
function _cpu_sp(v1, v2, itv) {
    if (v2 < v1) return 0
    return (v2 - v1) / itv * 100
}

function _cpu_f(x) { return sprintf("%.2f", x) }

# the percentage members (without braces) for samples p -> c over itv
function _cpu_pct(p, c, itv,    usr, nice, idle) {
    if (itv == 0)
        return "\"usr\":0.00,\"nice\":0.00,\"sys\":0.00,\"iowait\":0.00,\"irq\":0.00," \
               "\"soft\":0.00,\"steal\":0.00,\"guest\":0.00,\"gnice\":0.00,\"idle\":100.00,\"busy\":0.00"
    usr = ((c[1] - c[9]) < (p[1] - p[9])) ? 0 : _cpu_sp(p[1] - p[9], c[1] - c[9], itv)
    nice = ((c[2] - c[10]) < (p[2] - p[10])) ? 0 : _cpu_sp(p[2] - p[10], c[2] - c[10], itv)
    idle = _cpu_f(_cpu_sp(p[4], c[4], itv))
    return "\"usr\":" _cpu_f(usr) ",\"nice\":" _cpu_f(nice) \
           ",\"sys\":" _cpu_f(_cpu_sp(p[3], c[3], itv)) \
           ",\"iowait\":" _cpu_f(_cpu_sp(p[5], c[5], itv)) \
           ",\"irq\":" _cpu_f(_cpu_sp(p[6], c[6], itv)) \
           ",\"soft\":" _cpu_f(_cpu_sp(p[7], c[7], itv)) \
           ",\"steal\":" _cpu_f(_cpu_sp(p[8], c[8], itv)) \
           ",\"guest\":" _cpu_f(_cpu_sp(p[9], c[9], itv)) \
           ",\"gnice\":" _cpu_f(_cpu_sp(p[10], c[10], itv)) \
           ",\"idle\":" idle ",\"busy\":" _cpu_f(100 - idle)
}

function cpu_json(    maxcpu, name, i, k, p, c, pall, call, itv, itvall, per, n) {
    maxcpu = -1
    for (name in CPU_A)
        if (name ~ /^cpu[0-9]+$/ && substr(name, 4) + 0 > maxcpu) maxcpu = substr(name, 4) + 0
    for (k = 1; k <= 10; k++) { pall[k] = 0; call[k] = 0 }
    itvall = 0; per = ""; n = 0
    for (i = 0; i <= maxcpu; i++) {
        name = "cpu" i
        if (!(name in CPU_B) || !(name in CPU_A)) continue
        _cpu_fields(CPU_B[name], p)
        _cpu_fields(CPU_A[name], c)
        itv = _cpu_interval(p, c)
        itvall += itv
        for (k = 1; k <= 10; k++) { pall[k] += p[k]; call[k] += c[k] }
        per = per (n++ ? "," : "") "{\"cpu\":" i "," _cpu_pct(p, c, itv) "}"
    }
    return "{\"all\":{" _cpu_pct(pall, call, itvall) "},\"per_cpu\":[" per "],\"ticks\":" sprintf("%.0f", itvall) "}"
}
