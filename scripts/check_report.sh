#!/usr/bin/env bash
# Browser check of a report: scripts/check_report.sh REPORT_DIR [SCREENSHOT.png]
#
# Opens REPORT_DIR/index.html in headless Chromium and fails (exit 1) when the page logs a console error or an
# uncaught error, an image does not load or decode, or a required section is missing; saves a full-page
# screenshot (default REPORT_DIR/screenshot.png). Exit 2: usage error or no Chromium.
#
# How: a copy of the page with a small checker script inserted at the top of <head> is written beside
# index.html (so figures/ resolves the same way), loaded with --dump-dom, and the checker's verdict is read
# back from an attribute it sets on <html>. The report itself carries no script. Required section ids:
# $REPORT_SECTIONS (default below).
set -euo pipefail

die() { printf 'check_report: %s\n' "$*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: scripts/check_report.sh REPORT_DIR [SCREENSHOT.png]"
dir="$(cd "$1" 2>/dev/null && pwd)" || die "'$1' is not a folder"
page="$dir/index.html"
[ -f "$page" ] || die "no index.html in $dir"
shot="${2:-$dir/screenshot.png}"
sections="${REPORT_SECTIONS:-findings claims headline cite results notes environment}"
browser="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}"
[ -n "$browser" ] || die "no Chromium found (apt-get install -y chromium, or set CHROMIUM=/path/to/chrome)"

flags=(--headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking
       --disable-extensions --hide-scrollbars --allow-file-access-from-files)
probe="$dir/.check_report.$$.html"
log="$(mktemp)"
dom="$(mktemp)"
profile="$(mktemp -d)"
trap 'rm -rf "$probe" "$log" "$dom" "$profile"' EXIT

# The checker: records console.error calls, uncaught errors and failed resource loads from the first moment,
# then on load checks every image decoded and every required section exists; the verdict goes on <html>.
checker="<script>(function(){var bad=[];var ce=console.error;
console.error=function(){bad.push('console.error: '+Array.prototype.join.call(arguments,' '));ce.apply(console,arguments);};
window.addEventListener('error',function(e){var t=e.target;
 if(t&&t!==window&&(t.src||t.href)){bad.push('failed to load: '+(t.src||t.href));}
 else{bad.push('uncaught: '+(e.message||'error'));}},true);
window.addEventListener('load',function(){
 Array.prototype.forEach.call(document.images,function(i){if(!(i.complete&&i.naturalWidth>0)){bad.push('image did not decode: '+i.getAttribute('src'));}});
 '$sections'.split(' ').forEach(function(s){if(s&&!document.getElementById(s)){bad.push('missing section: #'+s);}});
 var h=Math.max(document.documentElement.scrollHeight,document.body?document.body.scrollHeight:0);
 document.documentElement.setAttribute('data-report-check',bad.length?bad.join(' | '):'ok');
 document.documentElement.setAttribute('data-report-height',String(h));});})();</script>"
python3 - "$page" "$probe" "$checker" <<'PY'
import sys
page, probe, checker = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(page, encoding="utf-8").read()
at = text.find("<head>")
text = text[: at + 6] + checker + text[at + 6:] if at >= 0 else checker + text
open(probe, "w", encoding="utf-8").write(text)
PY

timeout 120 "$browser" "${flags[@]}" --user-data-dir="$profile" --enable-logging=stderr --v=0 \
  --virtual-time-budget=10000 --dump-dom "file://$probe" >"$dom" 2>"$log" || true
verdict="$(python3 - "$dom" <<'PY'
import html, re, sys
dom = open(sys.argv[1], encoding="utf-8", errors="replace").read()
m = re.search(r'data-report-check="([^"]*)"', dom)
h = re.search(r'data-report-height="(\d+)"', dom)
print((html.unescape(m.group(1)) if m else "no verdict: the page did not finish loading") + "\t" + (h.group(1) if h else "2400"))
PY
)"
result="${verdict%%$'\t'*}"
height="${verdict##*$'\t'}"
# Chromium also prints uncaught page errors to its log; the checker sees console.error, this catches the rest.
console_errors="$(grep -E 'CONSOLE.*(Uncaught|Error)' "$log" | grep -v 'check_report' || true)"

height=$(( height < 800 ? 800 : (height > 30000 ? 30000 : height) ))
timeout 120 "$browser" "${flags[@]}" --user-data-dir="$profile" --window-size=1400,"$height" \
  --screenshot="$shot" "file://$page" >/dev/null 2>&1 || true

status=0
if [ "$result" != "ok" ]; then
  printf 'check_report: FAIL: %s\n' "$result" >&2; status=1
fi
if [ -n "$console_errors" ]; then
  printf 'check_report: FAIL: console: %s\n' "$console_errors" >&2; status=1
fi
if [ ! -s "$shot" ]; then
  printf 'check_report: FAIL: no screenshot written to %s\n' "$shot" >&2; status=1
fi
[ "$status" = 0 ] && printf 'check_report: ok: %s (sections: %s; screenshot %s, 1400x%s)\n' "$page" "$sections" "$shot" "$height"
exit "$status"
