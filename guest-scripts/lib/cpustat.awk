# cpustat.awk - print the "cpu" object of the result document for two
# /proc/stat samples (the reduction in cpu.awk, testable alone):
#   awk -f lib/cpu.awk -f lib/cpustat.awk BEFORE AFTER
FNR == 1 { nfile++ }
$1 ~ /^cpu[0-9]+$/ {
    if (nfile == 1) CPU_B[$1] = $0
    else CPU_A[$1] = $0
}
END { print cpu_json() }
