#!/usr/bin/env bash
# vflow-tokenize end to end on Debian's fortunes: the same model from the same files, shards
# that decode back to the text (SentencePiece's own spm_decode), a language model trained on
# them by vflow-train, and clear refusals.
# Usage: tokenize_test.sh VFLOW_TOKENIZE VFLOW_TRAIN
set -euo pipefail
tokenize="$1"
train="$2"
fortunes=/usr/share/games/fortunes/computers
if [[ ! -f $fortunes ]] || ! command -v spm_decode >/dev/null; then
  echo "SKIP: needs Debian's fortunes and sentencepiece (scripts/dev.sh deps)"
  exit 77
fi
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# The model is a function of the files: trained twice, it has the same pieces and scores
# (NAME.vocab; the .model file records its own name too).
"$tokenize" train --vocab-size 800 --model "$dir/a.model" "$fortunes" >/dev/null 2>&1
"$tokenize" train --vocab-size 800 --model "$dir/b.model" "$fortunes" >/dev/null 2>&1
cmp -s "$dir/a.vocab" "$dir/b.vocab" || fail "two trainings on the same files differ"

"$tokenize" encode --model "$dir/a.model" --out "$dir/shards" --eval-every 10 "$fortunes" \
  >"$dir/encode.log" 2>&1 || { cat "$dir/encode.log"; fail "encode failed"; }
grep -q "name: token-shards" "$dir/encode.log" || fail "encode printed no job spec lines"

# The first entry's ids (up to the end-of-text id 2), decoded by SentencePiece itself, are
# the first fortune's text.
/usr/bin/python3 - "$dir/shards/train_000000.bin" "$fortunes" "$dir" <<'PY'
import struct, subprocess, sys
shard, text_file, out = sys.argv[1:]
data = open(shard, "rb").read()
magic, version, count = struct.unpack("<3i", data[:12])
assert (magic, version) == (20240520, 1), (magic, version)
assert len(data) == 1024 + 2 * count, (len(data), count)
tokens = struct.unpack(f"<{count}H", data[1024:])
first = list(tokens[:tokens.index(2)])
decoded = subprocess.run(["spm_decode", f"--model={out}/a.model", "--input_format=id"],
                         input=" ".join(map(str, first)) + "\n", capture_output=True,
                         text=True, check=True).stdout.rstrip("\n")
entry = open(text_file, encoding="utf-8").read().split("\n%\n")[0].rstrip()
if decoded != entry:
    sys.exit(f"FAIL: the first entry decodes to {decoded!r}, the file has {entry!r}")
print(f"first entry: {len(first)} tokens decode to its {len(entry)} bytes")
PY

# A language model trains on the shards.
"$train" --set semantic.data="{name: token-shards, options: {train: $dir/shards/train_*.bin, \
eval: $dir/shards/eval_*.bin, context: 32, vocab_size: 800}}" \
  --set semantic.model="{name: transformer-lm, options: {layers: 1, hidden: 32, heads: 2}}" \
  --set semantic.global_batch=32 --set semantic.virtual_nodes=4 --set semantic.steps=20 \
  --set semantic.epochs=null --set resources.threads=1 --set output.logging.progress=off \
  >"$dir/train.log" 2>&1 || { cat "$dir/train.log"; fail "training on the shards failed"; }
grep -q "fingerprint" "$dir/train.log" || { cat "$dir/train.log"; fail "no fingerprint"; }

# Refusals: a model that is not there, a model name without .model.
set +e
"$tokenize" encode --model "$dir/none.model" --out "$dir/x" "$fortunes" >"$dir/err.log" 2>&1
code=$?
set -e
((code == 2)) || fail "a missing model: exit code $code, expected 2"
grep -q -- "--model: $dir/none.model" "$dir/err.log" || fail "the error names no model: $(cat "$dir/err.log")"
set +e
"$tokenize" train --model "$dir/a.bin" "$fortunes" >"$dir/err.log" 2>&1
code=$?
set -e
((code == 2)) || fail "a model name without .model: exit code $code, expected 2"
echo "vflow-tokenize: deterministic model, round trip, training and refusals checked"
