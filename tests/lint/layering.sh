#!/usr/bin/env bash
# The house's layering rules (README.md "Contributing", Layout) as a test:
#   - service/ includes no engine header but engine.h (the front door), and
#     its rooms (its folders, and each file at its top) include only
#     themselves and the rooms below them, in the order SERVICE_ROOMS
#     (service/CMakeLists.txt, lowest first);
#   - kernels/ includes of the engine only backend.h, the interface it implements;
#   - an engine room includes only itself and the rooms below it, in the order
#     engine/CMakeLists.txt declares its modules (passed here as ROOMS, lowest
#     first; the root files are "base", engine.c and engine.h are "front", the
#     only ones that may include kernels/ to open the CUDA backend);
#   - no include cycle between files;
#   - with object files: no call cycle between the engine's files. A file that
#     uses an external symbol another file defines depends on it (nm). The
#     UNITS below are the exceptions: one piece of code split over files that
#     call each other, sharing a private header; the check treats each as one
#     file, so a circle through anything outside it still fails.
# Usage: layering.sh SOURCE_DIR "ENGINE_ROOM..." "SERVICE_ROOM..." [NM OBJECT...]
# Plain POSIX tools (find, grep, awk, tsort, nm): no compiler, no Python.
set -euo pipefail
src=$1 rooms=$2 svc_rooms=$3
shift 3
cd "$src"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# ---- includes -----------------------------------------------------------------
find service engine kernels -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \
  -o -name '*.cuh' -o -name '*.cpp' \) | sort > "$tmp/files"
# Quoted includes only: <...> are the system's and the libraries'.
xargs grep -HoE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]+"' < "$tmp/files" \
  > "$tmp/includes" || true

awk -v rooms="$rooms" -v svc_rooms="$svc_rooms" -v edges="$tmp/include_edges" '
  # A file resolves as the compiler finds it: beside the includer, then the
  # include roots its target is given (service/, engine/ and kernels/CMakeLists.txt).
  function room(p,   a, n) {
    n = split(p, a, "/")
    if (a[1] != "engine") return a[1]
    if (n == 2) return (a[2] ~ /^engine\.[ch]$/) ? "front" : "base"
    return a[2]
  }
  function dirname(p) { sub(/\/[^\/]*$/, "", p); return p }
  # The room of a service file: its folder, or for a file at the top its name.
  function svc_room(p,   a, n) {
    n = split(p, a, "/")
    if (n > 2) return a[2]
    sub(/\.[ch]$/, "", a[2]); return a[2]
  }
  function bad(msg) { print "layering: " msg; errors++ }
  FILENAME != "-" { exists[$0] = 1; next }
  {
    f = $0; sub(/:.*/, "", f)
    inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*$/, "", inc)
    top = f; sub(/\/.*/, "", top)
    if (top == "service") roots = "service engine"
    else if (top == "engine") roots = "engine kernels"
    else roots = "kernels kernels/host engine"
    t = ""
    if ((dirname(f) "/" inc) in exists) t = dirname(f) "/" inc
    else {
      nr = split(roots, r, " ")
      for (i = 1; i <= nr && t == ""; i++) if ((r[i] "/" inc) in exists) t = r[i] "/" inc
    }
    if (t == "") next # generated or outside the tree
    print f, t > edges
    rf = room(f); rt = room(t)
    if (rf == "service") {
      if (rt == "kernels" || (t ~ /^engine\// && t != "engine/engine.h"))
        bad(f " includes " t ": service/ sees the engine only through engine.h")
      if (rt == "service") {
        sf = svc_room(f); st = svc_room(t)
        if (sf != st) {
          if (!(sf in srank)) bad(f ": service room " sf " is not in the room order (" svc_rooms ")")
          else if (!(st in srank)) bad(t ": service room " st " is not in the room order (" svc_rooms ")")
          else if (srank[st] > srank[sf])
            bad(f " includes " t ": service room " sf " sits below " st " (order: " svc_rooms ")")
        }
      }
    } else if (rf == "kernels") {
      if (rt == "service" || (t ~ /^engine\// && t != "engine/backend.h"))
        bad(f " includes " t ": kernels/ sees the engine only through backend.h")
    } else if (rt == "service") {
      bad(f " includes " t ": the engine knows nothing of the service")
    } else if (rt == "kernels") {
      if (rf != "front") bad(f " includes " t ": only engine.c opens the CUDA backend")
    } else if (rf != rt) {
      if (!(rf in rank)) bad(f ": room " rf " is not in the room order (" rooms ")")
      else if (!(rt in rank)) bad(t ": room " rt " is not in the room order (" rooms ")")
      else if (rank[rt] > rank[rf])
        bad(f " includes " t ": room " rf " sits below " rt " (order: " rooms ")")
    }
  }
  BEGIN {
    n = split(rooms, o, " "); for (i = 1; i <= n; i++) rank[o[i]] = i
    n = split(svc_rooms, o, " "); for (i = 1; i <= n; i++) srank[o[i]] = i
  }
  END { exit errors > 0 }
' "$tmp/files" - < "$tmp/includes" || fail=1

# tsort names the files of every loop it has to break.
touch "$tmp/include_edges"
if ! tsort "$tmp/include_edges" > /dev/null 2> "$tmp/loops"; then
  echo "layering: include cycle:"; sed -e 's/^tsort: .*input contains a loop:/  loop:/' -e 's/^tsort: /    /' "$tmp/loops"; fail=1
fi

# ---- calls --------------------------------------------------------------------
# One line per unit: its files, then why they call each other.
UNITS='
engine/grammar/schema.c engine/grammar/schema_value.c engine/grammar/schema_object.c engine/grammar/schema_combine.c engine/grammar/schema_merge.c : one recursive descent over a schema (schema_internal.h): a value holds schemas, a combinator holds values
engine/grammar/fsm.c engine/grammar/fsm_min.c : the automaton and its minimisation, one data structure (fsm_internal.h)
engine/grammar/regex.c engine/grammar/lexemes.c : the lexeme library compiles its patterns with the regex compiler, which takes the JSON string lexemes from it
engine/grammar/json_mode.c engine/grammar/json_vocab.c : the JSON-mode automaton and its vocabulary tables (json_mode_internal.h)
'
if [ $# -gt 0 ]; then
  nm=$1
  shift
  # An object's source: build/engine/CMakeFiles/<target>.dir/<path>.o -> engine/<path>.
  "$nm" -A -P -g "$@" | awk '{
    s = $1; sub(/:$/, "", s); sub(/.*\/CMakeFiles\/[^\/]*\.dir\//, "", s); sub(/\.o$/, "", s)
    print "engine/" s, $2, ($3 == "U" ? "U" : "D")
  }' > "$tmp/symbols"
  printf '%s' "$UNITS" | awk -F' : ' 'NF { n = split($1, f, " "); for (i = 1; i <= n; i++) print f[i], f[1] }' \
    > "$tmp/unit_of"
  awk '
    FILENAME ~ /unit_of$/ { unit[$1] = $2; next }
    { if ($1 in unit) $1 = unit[$1] }
    $3 == "D" { n[$2]++; def[$2] = $1; next }
    { use[NR] = $1 " " $2 }
    END {
      for (i in use) {
        split(use[i], u, " ")
        if (n[u[2]] == 1 && def[u[2]] != u[1]) print u[1], def[u[2]]
      }
    }' "$tmp/unit_of" "$tmp/symbols" | sort -u > "$tmp/call_edges"
  if ! tsort "$tmp/call_edges" > /dev/null 2> "$tmp/loops"; then
    echo "layering: call cycle between engine files:"; sed -e 's/^tsort: .*input contains a loop:/  loop:/' -e 's/^tsort: /    /' "$tmp/loops"
    fail=1
  fi
fi
exit $fail
