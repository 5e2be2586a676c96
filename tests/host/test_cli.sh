#!/bin/sh
# tessera check / plugins end to end on the test catalog (build/tests/catalog).
# Run by ctest with TESSERA_BIN and TESSERA_BUILD_DIR set.
set -u
T=${TESSERA_BIN:?}
CAT=${TESSERA_BUILD_DIR:?}/tests/catalog
if [ ! -x "$T" ] || [ ! -f "$CAT/libtest_gemv.so" ]; then
    echo "skipped: no tessera binary or no test catalog"; exit 0
fi
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$T" check --help | grep -q "usage: tessera check" || fail "check --help"
"$T" plugins --help | grep -q "plugins call" || fail "plugins --help"

cat > "$TMP/good.yaml" <<'Y'
name: cli-good
device: cpu
slots:
  attention: test_attention
  kv_cache: {plugin: test_kv_cache, params: {dtype: f32}}
  drafter: test_drafter
  expert_cache: test_expert_cache
  gemv: {plugin: test_gemv, params: {threads: 4}}
Y
out=$("$T" check "$TMP/good.yaml" --catalog "$CAT" --allow-test) || fail "good assembly refused: $out"
echo "$out" | grep -q "gemv .*test_gemv .*1.2.3 .*threads=4" || fail "describe: $out"
echo "$out" | grep -q "kv_dtype=f32 kv_layout=contiguous" || fail "provides: $out"

# model requirements: noted without a model, checked against one
echo "$out" | grep -q "note: not checked: no model: plugin test_expert_cache requires model.moe in \[true\]" \
    || fail "no-model note: $out"
FIX=${TESSERA_SOURCE_DIR:-.}/tests/data/fixtures/transformers
if [ -f "$FIX/mixtral/config.json" ] && [ -f "$FIX/llama/config.json" ]; then
    "$T" check "$TMP/good.yaml" --catalog "$CAT" --allow-test --model "$FIX/mixtral" > "$TMP/out" 2>&1 \
        || fail "moe model refused: $(cat "$TMP/out")"
    grep -q "passes against the model" "$TMP/out" || fail "moe model: $(cat "$TMP/out")"
    "$T" check "$TMP/good.yaml" --catalog "$CAT" --allow-test --model "$FIX/llama" > /dev/null 2> "$TMP/err"; rc=$?
    [ $rc -eq 2 ] || fail "dense model accepted (rc $rc)"
    grep -q "good.yaml:7:3: error: plugin test_expert_cache requires model.moe in \[true\], the model has false" "$TMP/err" \
        || fail "dense model: $(cat "$TMP/err")"
else
    echo "model fixtures absent: model checks skipped"
fi

# the same without --allow-test: refused, one error per slot, exit 2
"$T" check "$TMP/good.yaml" --catalog "$CAT" > /dev/null 2> "$TMP/err"; rc=$?
[ $rc -eq 2 ] || fail "test plugins accepted without --allow-test (rc $rc)"
[ "$(grep -c 'error: .*test plugin' "$TMP/err")" -eq 5 ] || fail "$(cat "$TMP/err")"

# every error at once, each with file:line:col
cat > "$TMP/bad.yaml" <<'Y'
name: cli-bad
device: cpu
slots:
  attention: test_attention
  kv_cache: {plugin: test_kv_cache, params: {dtype: f16, colour: 1}}
  drafter: nosuch
  gemv: {plugin: test_gemv, params: {threads: 5000}}
Y
"$T" check "$TMP/bad.yaml" --catalog "$CAT" --allow-test > /dev/null 2> "$TMP/err"; rc=$?
[ $rc -eq 2 ] || fail "bad assembly: rc $rc"
grep -q "bad.yaml:5:58: error: .*unknown param 'colour'" "$TMP/err" || fail "colour: $(cat "$TMP/err")"
grep -q "bad.yaml:6:3: error: .*no plugin 'nosuch'" "$TMP/err" || fail "nosuch: $(cat "$TMP/err")"
grep -q "bad.yaml:7:47: error: .*out of range" "$TMP/err" || fail "threads: $(cat "$TMP/err")"
grep -q "bad.yaml:4:3: error: .*kv_dtype = \[f16\]" "$TMP/err" || fail "requires: $(cat "$TMP/err")"
grep -q "refused (4 errors)" "$TMP/err" || fail "count: $(cat "$TMP/err")"

# a Lua assembly that raises: its file and line
printf 'local a = 1\nerror("no engine for you")\n' > "$TMP/bad.lua"
"$T" check "$TMP/bad.lua" --catalog "$CAT" --allow-test > /dev/null 2> "$TMP/err"; rc=$?
[ $rc -eq 2 ] || fail "bad lua: rc $rc"
grep -q "bad.lua:2: error: .*no engine for you" "$TMP/err" || fail "lua: $(cat "$TMP/err")"

# plugins list / show / call
"$T" plugins --catalog "$CAT" | grep -q "^test_gemv .*\[test\]" || fail "plugins list"
"$T" plugins show test_kv_cache --catalog "$CAT" | grep -q "kv_dtype: \$dtype" || fail "plugins show"
[ "$("$T" plugins call test_gemv test_gemv_add_i32 40 2 --catalog "$CAT")" = 42 ] || fail "call int32"
[ "$("$T" plugins call test_gemv test_gemv_fma 1.5 0.25 -1 --catalog "$CAT")" = -0.625 ] || fail "call double"
[ "$("$T" plugins call test_gemv test_gemv_parity 7 --catalog "$CAT")" = odd ] || fail "call string"
"$T" plugins call test_gemv test_gemv_add_i32 40 --catalog "$CAT" > /dev/null 2>&1 && fail "arity accepted"
"$T" plugins call test_gemv nope --catalog "$CAT" > /dev/null 2>&1 && fail "unknown export accepted"
"$T" plugins show nosuch --catalog "$CAT" > /dev/null 2>&1 && fail "unknown plugin accepted"

# tessera passes (the embedded model, the real catalog) and tessera run --profile
RCAT=${TESSERA_BUILD_DIR}/catalog
out=$("$T" passes --catalog "$RCAT" --context 8 --rows 1,3 --reps 3 2>/dev/null) || fail "passes: $out"
echo "$out" | grep -q "^rows  1: .* ms" || fail "passes rows 1: $out"
echo "$out" | grep -q "^rows  3: .* x[0-9]" || fail "passes rows 3: $out"
"$T" passes --catalog "$RCAT" --rows 1,0 > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "passes --rows 1,0: rc $rc"
"$T" run --catalog "$RCAT" -p "Once upon a time" -n 4 --profile 2> "$TMP/prof" > /dev/null || fail "run --profile"
grep -q "profile of decode passes" "$TMP/prof" || fail "profile: $(cat "$TMP/prof")"
grep -q "^  gate/up " "$TMP/prof" || fail "profile kinds: $(cat "$TMP/prof")"
echo "ok"
