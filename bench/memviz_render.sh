#!/bin/bash
# Renders a memory snapshot (torch.cuda.memory._dump_snapshot's pickle, or .pickle.gz) with
# PyTorch's own memory_viz viewer, MemoryViz.js (the code behind pytorch.org/memory_viz), in
# headless Chromium, and takes a screenshot of each view asked for. Nothing here draws: the page
# is the one torch.cuda._memory_viz.trace_plot() writes (the snapshot embedded in base64, then
# MemoryViz.js's add_local_files(files, view)), except that MemoryViz.js and d3 load from local
# copies through an import map instead of from CDNs, served on the loopback.
#
#   bench/memviz_render.sh SNAPSHOT[.gz] OUTDIR [VIEW...]
#
# Inputs:
#   SNAPSHOT      the pickle (gzip-compressed if its name ends in .gz)
#   OUTDIR        where the PNGs, pages and logs go (created)
#   VIEW          memory_viz views by the names of its view menu; default "Active Memory
#                 Timeline" and "Allocator State History"
#   MEMVIZ_JS     PyTorch's torch/utils/viz/MemoryViz.js: a copy from a pytorch checkout (newer
#                 ones import ./process_alloc_data.js, which must then lie beside it). Default:
#                 torch/utils/viz/MemoryViz.js of an importable torch, if it has one. This
#                 repository ships no copy.
#   SIZE          window size, default 1400,900
#   MEMVIZ_EVENT  "Allocator State History" only: the index of the trace event to select once
#                 loaded ("mid": the middle one), as a click on it in the event list does;
#                 memory_viz then replays the trace backwards from the snapshot to that event.
#                 Default: none, memory_viz's own first picture (the last event selected).
#   D3_CACHE      where d3 is installed, default ~/.cache/gmlake-memviz
# Installs: Debian's chromium (apt-get) when no chromium is on PATH; with npm, the d3 major
# version the given MemoryViz.js imports (d3@7 today, d3@5 for older copies) into D3_CACHE.
# Output, per VIEW, NAME being the view's name in lower case with '_' for spaces:
#   OUTDIR/NAME.png       the screenshot (timelines: with the largest allocation hovered, so
#                         the pane below shows what memory_viz says of it and its stack)
#   OUTDIR/NAME.html      the page (MemoryViz.js and d3 under OUTDIR/js)
#   OUTDIR/NAME.log       Chromium's log, the page's console included (--enable-logging=stderr)
#   OUTDIR/NAME.dom.html  the DOM once rendered (--dump-dom)
# and on stdout a line per view: the page's final title, "OK" with what the rendered SVG holds,
# or "ERROR" with the first uncaught JavaScript error. Exits 1 when a view shows an error or
# draws nothing (no polygon and no rectangle; the settings view excepted).
# Not part of `make test`: CI has no Chromium.
set -euo pipefail

[ $# -ge 2 ] || { sed -n '2,38p' "$0"; exit 2; }
snap=$1
out=$2
shift 2
views=("$@")
[ ${#views[@]} -gt 0 ] || views=("Active Memory Timeline" "Allocator State History")
size=${SIZE:-1400,900}
cache=${D3_CACHE:-$HOME/.cache/gmlake-memviz}
[ -f "$snap" ] || { echo "memviz_render: no snapshot $snap" >&2; exit 2; }

js=${MEMVIZ_JS:-}
if [ -z "$js" ]; then
  js=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "utils/viz/MemoryViz.js"))' 2>/dev/null || true)
fi
if [ -z "$js" ] || [ ! -f "$js" ]; then
  echo "memviz_render: set MEMVIZ_JS to PyTorch's torch/utils/viz/MemoryViz.js" >&2
  exit 2
fi

browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
  browser=$(command -v chromium)
fi

d3major=$(grep -o 'd3@[0-9]*' "$js" | head -1 | cut -d@ -f2 || true)
d3major=${d3major:-5}
d3dir=$cache/d3-$d3major
if [ ! -f "$d3dir/node_modules/d3/package.json" ]; then
  mkdir -p "$d3dir"
  (cd "$d3dir" && npm install --no-audit --no-fund --silent "d3@$d3major" >/dev/null)
fi

mkdir -p "$out/js"
cp "$js" "$out/js/MemoryViz.js"
if [ -f "$(dirname "$js")/process_alloc_data.js" ]; then
  cp "$(dirname "$js")/process_alloc_data.js" "$out/js/"
fi
rm -rf "$out/js/node_modules"
cp -r "$d3dir/node_modules" "$out/js/node_modules"

# A static server for OUTDIR on the loopback (module scripts do not load from file://). d3@5's
# modules import their siblings without ".js" (they were written for bundlers): a path that does
# not exist is answered with PATH.js where that exists, as a bundler resolves it.
rm -f "$out/.port"
python3 - "$out" "$out/.port" <<'PY' &
import http.server, os, sys
root, portfile = sys.argv[1:3]
class Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".js": "text/javascript", ".mjs": "text/javascript"}
    def __init__(self, *a, **k):
        super().__init__(*a, directory=root, **k)
    def translate_path(self, path):
        p = super().translate_path(path)
        return p + ".js" if not os.path.exists(p) and os.path.isfile(p + ".js") else p
    def guess_type(self, path):
        return "text/javascript" if path.endswith(".js") else super().guess_type(path)
    def log_message(self, *a):
        pass
with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as srv:
    with open(portfile + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(portfile + ".tmp", portfile)
    srv.serve_forever()
PY
server=$!
trap 'kill $server 2>/dev/null || true; rm -f "$out/.port"' EXIT
for _ in $(seq 100); do [ -s "$out/.port" ] && break; sleep 0.1; done
port=$(cat "$out/.port")

status=0
for view in "${views[@]}"; do
  name=$(echo "$view" | tr 'A-Z ' 'a-z_' | tr -cd 'a-z0-9_.-')
  python3 - "$snap" "$out" "$view" "$name" "${MEMVIZ_EVENT:-}" <<'PY'
import base64, gzip, json, os, re, sys

snap, out, view, name, event = sys.argv[1:6]
with (gzip.open if snap.endswith(".gz") else open)(snap, "rb") as f:
    data = f.read()
# as torch.cuda._memory_viz._format_viz: padded to a multiple of 3, base64
data += b"\x00" * (3 - len(data) % 3)
files = json.dumps([{"name": os.path.basename(snap).removesuffix(".gz"),
                     "base64": base64.b64encode(data).decode()}])

# import map: each module MemoryViz.js imports (a CDN URL or a bare name) to the npm copy
mods = os.path.join(out, "js", "node_modules")
def entry(pkg):
    with open(os.path.join(mods, pkg, "package.json")) as f:
        meta = json.load(f)
    exp = meta.get("exports")
    if isinstance(exp, dict):
        exp = exp.get(".", exp)
        if isinstance(exp, dict):
            exp = exp.get("import") or exp.get("default")
    path = meta.get("module") or (exp if isinstance(exp, str) else None) or meta.get("main") or "index.js"
    return "./js/node_modules/%s/%s" % (pkg, path.removeprefix("./"))
imports = {pkg: entry(pkg) for pkg in sorted(os.listdir(mods))
           if os.path.isfile(os.path.join(mods, pkg, "package.json"))}
with open(os.path.join(out, "js", "MemoryViz.js")) as f:
    src = f.read()
for spec in re.findall(r'from\s+"([^"]+)"', src):
    m = re.search(r"/(d3(?:-[a-z]+)*)@", spec)
    if m and m.group(1) in imports:
        imports[spec] = imports[m.group(1)]

# trace_plot's page, plus a watcher that writes the outcome into the title
page = """<!DOCTYPE html>
<html>
<head>
<title>LOADING</title>
<script type="importmap">%(map)s</script>
<script>
window.addEventListener('error', e => { if (!document.title.startsWith('ERROR')) document.title = 'ERROR ' + e.message; });
window.addEventListener('unhandledrejection', e => { document.title = 'ERROR ' + e.reason; });
</script>
</head>
<body>
<script type="module">
import {add_local_files} from "./js/MemoryViz.js"
const local_files = %(files)s
add_local_files(local_files, %(view)s)
const pick = %(event)s;
function check() {
  if (document.title.startsWith('ERROR')) return;
  const rows = [...document.querySelectorAll('div[style*="font-family: monospace"] > pre')];
  if (pick !== null && rows.length > 0) {
    const i = pick === 'mid' ? Math.floor(rows.length / 2) : Number(pick);
    document.title = 'SELECTING event ' + i;
    // memory_viz selects an event on mousedown (hover mode) or on click (click mode)
    for (const kind of ['mousedown', 'click'])
      rows[i].dispatchEvent(new MouseEvent(kind, {bubbles: true}));
    rows[i].scrollIntoView({block: 'center'});
    if (document.title.startsWith('ERROR')) return;
  }
  // timelines: hover the largest allocation, so the pane below shows what memory_viz says of
  // it (address, size, stream, its stack)
  let hovered = '';
  const bands = [...document.querySelectorAll('svg polygon')].filter(
    p => p.__data__ && typeof p.__data__.elem === 'number' && typeof p.__data__.size === 'number');
  if (bands.length > 0) {
    const big = bands.reduce((a, b) => (b.__data__.size > a.__data__.size ? b : a));
    big.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
    if (document.title.startsWith('ERROR')) return;
    hovered = ' hovered=' + big.__data__.size + 'B';
  }
  document.title = 'OK polygons=' + document.querySelectorAll('svg polygon').length +
                   ' rects=' + document.querySelectorAll('svg rect').length +
                   ' event_rows=' + rows.length + (pick !== null ? ' selected=' + pick : '') + hovered;
}
setTimeout(check, 2000);
</script>
</body>
</html>
"""
with open(os.path.join(out, name + ".html"), "w") as f:
    f.write(page % {"map": json.dumps({"imports": imports}, indent=1), "files": files,
                    "view": json.dumps(view), "event": json.dumps(event or None)})
PY
  url="http://127.0.0.1:$port/$name.html"
  flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="$size"
         --virtual-time-budget=60000 --run-all-compositor-stages-before-draw)
  "$browser" "${flags[@]}" --enable-logging=stderr --v=0 --dump-dom "$url" \
    >"$out/$name.dom.html" 2>"$out/$name.log" || true
  "$browser" "${flags[@]}" --screenshot="$out/$name.png" "$url" >/dev/null 2>&1 || true
  title=$(sed -n 's:.*<title>\([^<]*\)</title>.*:\1:p' "$out/$name.dom.html" | head -1)
  echo "$view: ${title:-no title (the page did not load)}"
  case "$title" in
    OK*" polygons=0 rects=0 "*) [ "$view" = "Allocator Settings" ] || status=1 ;;
    OK*) ;;
    *) status=1 ;;
  esac
  grep -a "CONSOLE.*Uncaught" "$out/$name.log" | head -3 || true
done
exit $status
