# The binder of off-map characters (see agent/src/runtime/sandbox/guest-input.ts), run with
# LC_ALL=C (byte semantics). Input: `xmodmap -pk`; env W: the segment's text; K: the previous
# segment's; P: `xprop` of the keys property. It binds every character of W from U+00A0 up that
# the keymap lacks, pipes the changed keycodes' lines to `xmodmap -` and prints the new property.
function chars(t, ordered,   i, b, n, cp, s) {
  for (i = 1; i <= length(t); i++) {
    b = byte[substr(t, i, 1)] + 0
    if (b < 192) continue
    n = b >= 240 ? 3 : b >= 224 ? 2 : 1
    cp = b - (n == 3 ? 240 : n == 2 ? 224 : 192)
    for (; n > 0; n--) cp = cp * 64 + byte[substr(t, ++i, 1)] - 128
    if (cp < 160) continue
    s = sprintf("0x%04x", cp < 256 ? cp : cp + 16777216)
    if (ordered && !(s in keep)) want[++nw] = s
    keep[s] = 1
  }
}
BEGIN { for (i = 128; i < 256; i++) byte[sprintf("%c", i)] = i }
$1 ~ /^[0-9]+$/ {
  code[++nc] = $1; n = 0
  for (i = 2; i <= NF; i++) if ($i ~ /^0x/) { col[$1, ++n] = $i; if ($i != "0x0000") { on[$i] = 1; used[$1] = 1 } }
}
END {
  P = ENVIRON["P"]
  if (!sub(/^[^"]*"/, "", P)) P = ""
  sub(/".*/, "", P)
  m = split(P, e, " ")
  for (i = 1; i <= m; i++) {
    split(e[i], f, ".")
    if (f[3] !~ /^0x/ || col[f[1], 2 * f[2] - 1] != f[3] || ((f[1] "." f[2]) in at)) continue
    at[f[1] "." f[2]] = f[3]; order[++no] = f[1] "." f[2]; ours[f[1]] = 1
  }
  chars(ENVIRON["W"], 1); chars(ENVIRON["K"], 0)
  for (i = 1; i <= nc; i++) if (!(code[i] in used)) { spare = code[i]; break }
  for (i = 1; i <= nw; i++) {
    if (want[i] in on) continue
    slot = ""
    for (j = 1; j <= nc && slot == ""; j++) if (code[j] in ours) for (g = 1; g <= 4 && slot == ""; g++) if (!((code[j] "." g) in at)) slot = code[j] "." g
    for (j = 1; j <= nc && slot == ""; j++) if (!(code[j] in used) && !(code[j] in ours) && code[j] != spare) { slot = code[j] ".1"; ours[code[j]] = 1 }
    for (j = 1; j <= no && slot == ""; j++) if (order[j] != "" && !(at[order[j]] in keep)) slot = order[j]
    if (slot == "") continue
    for (j = 1; j <= no; j++) if (order[j] == slot) order[j] = ""
    order[++no] = slot; at[slot] = want[i]; on[want[i]] = 1
    split(slot, f, "."); if (!(f[1] in dirty)) { dirty[f[1]] = 1; nd++ }
  }
  if (!nd) exit
  for (c in dirty) {
    for (top = 4; !((c "." top) in at); top--) ;
    line = "keycode " c " ="
    for (g = 1; g <= top; g++) line = line (((c "." g) in at) ? " " at[c "." g] " " at[c "." g] : " NoSymbol NoSymbol")
    print line | "/usr/bin/xmodmap -"
  }
  close("/usr/bin/xmodmap -")
  for (j = 1; j <= no; j++) if (order[j] != "") v = v " " order[j] "." at[order[j]]
  print substr(v, 2)
}
