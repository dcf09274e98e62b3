# jsoncheck.awk - exit 0 when the input is exactly one valid JSON value, else
# print "jsoncheck: LINE: message" to stdout and exit 1.
#
# Used to decide whether fio's and mpstat's output can be embedded verbatim in
# the result document. POSIX awk; no token may span lines (true of any valid
# JSON: strings cannot hold raw newlines).
#
# State machine with an explicit stack:
#   st = "value"  a value must come next
#        "vclose" a value or "]" (just after "[")
#        "kclose" a key string or "}" (just after "{")
#        "key"    a key string (after "," in an object)
#        "colon"  ":" (after a key)
#        "after"  "," or a closing bracket (or the end, at depth 0)
BEGIN {
    st = "value"; depth = 0; bad = ""
    CTL = sprintf("[%c-%c]", 1, 31)
    STR = "^\"([^\"\\\\]|\\\\([\"\\\\/bfnrt]|u[0-9a-fA-F][0-9a-fA-F][0-9a-fA-F][0-9a-fA-F]))*\""
    NUM = "^-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][-+]?[0-9]+)?"
}
bad == "" {
    s = $0
    while (bad == "") {
        sub(/^[ \t\r]+/, "", s)
        if (s == "") break
        c = substr(s, 1, 1)
        if (c == "\"") {
            if (!match(s, STR)) { bad = "bad string"; break }
            tok = substr(s, 1, RLENGTH)
            if (tok ~ CTL) { bad = "control character in string"; break }
            kind = "string"
        } else if (c ~ /[-0-9]/) {
            if (!match(s, NUM)) { bad = "bad number"; break }
            kind = "scalar"
        } else if (substr(s, 1, 4) == "true" || substr(s, 1, 4) == "null") {
            RLENGTH = 4; kind = "scalar"
        } else if (substr(s, 1, 5) == "false") {
            RLENGTH = 5; kind = "scalar"
        } else if (c ~ /[][{}:,]/) {
            RLENGTH = 1; kind = c
        } else {
            bad = "unexpected character '" c "'"; break
        }
        s = substr(s, RLENGTH + 1)
        step(kind)
    }
    if (bad != "") badline = NR
}
function step(k) {
    if (st == "value" || st == "vclose") {
        if (st == "vclose" && k == "]") { close_("["); return }
        if (k == "{") { stack[++depth] = "{"; st = "kclose"; return }
        if (k == "[") { stack[++depth] = "["; st = "vclose"; return }
        if (k == "string" || k == "scalar") { st = "after"; return }
        bad = "expected a value, got '" k "'"; return
    }
    if (st == "kclose" || st == "key") {
        if (st == "kclose" && k == "}") { close_("{"); return }
        if (k == "string") { st = "colon"; return }
        bad = "expected a key, got '" k "'"; return
    }
    if (st == "colon") {
        if (k == ":") { st = "value"; return }
        bad = "expected ':', got '" k "'"; return
    }
    # st == "after"
    if (depth == 0) { bad = "trailing data after the value"; return }
    if (k == ",") { st = (stack[depth] == "{") ? "key" : "value"; return }
    if (k == "}") { close_("{"); return }
    if (k == "]") { close_("["); return }
    bad = "expected ',' or a closing bracket, got '" k "'"
}
function close_(open) {
    if (depth == 0 || stack[depth] != open) { bad = "mismatched bracket"; return }
    depth--
    st = "after"
}
END {
    if (bad == "" && !(st == "after" && depth == 0)) { bad = "incomplete JSON"; badline = NR }
    if (bad != "") { print "jsoncheck: " badline ": " bad; exit 1 }
    exit 0
}
