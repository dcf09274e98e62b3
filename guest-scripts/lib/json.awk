# json.awk - JSON helpers shared by the guest-script awk programs.
# POSIX awk only (runs under mawk, busybox awk, gawk --posix).

# jstr(s): s as a JSON string literal (quotes added).
function jstr(s,    out, i, n, c) {
    if (!_jinit) _json_init()
    out = ""
    n = length(s)
    for (i = 1; i <= n; i++) {
        c = substr(s, i, 1)
        if (c in _jesc)
            out = out _jesc[c]
        else
            out = out c
    }
    return "\"" out "\""
}

# jstr_or_null(s): null for the empty string, else jstr(s).
function jstr_or_null(s) {
    return s == "" ? "null" : jstr(s)
}

# jnum_or_null(s): s when it is an unsigned integer, else null.
function jnum_or_null(s) {
    return s ~ /^[0-9]+$/ ? s : "null"
}

# jlist(s): the blank-separated words of s as a JSON array of strings.
function jlist(s,    a, n, i, out) {
    n = split(s, a, " ")
    out = "["
    for (i = 1; i <= n; i++)
        out = out (i > 1 ? "," : "") jstr(a[i])
    return out "]"
}

# int0(x): x printed as an integer (no exponent for big counters).
function int0(x) {
    return sprintf("%.0f", x)
}

function _json_init(    i) {
    _jinit = 1
    for (i = 1; i < 32; i++)
        _jesc[sprintf("%c", i)] = sprintf("\\u%04x", i)
    _jesc[sprintf("%c", 127)] = "\\u007f"
    _jesc["\""] = "\\\""
    _jesc["\\"] = "\\\\"
    _jesc["\n"] = "\\n"
    _jesc["\t"] = "\\t"
    _jesc["\r"] = "\\r"
}
