#!/usr/bin/env bash
# Token shards of Debian's English fortunes through a SentencePiece model trained on them,
# for examples/jobs/fortunes-spm-lm.yaml: installs SentencePiece and the fortunes where they
# are missing, builds vflow-tokenize, trains the model and writes the shards.
#
#   scripts/make-token-shards.sh [OUT]   # default data/fortunes-spm (relative to the
#                                        # working directory, as the example job reads it)
#   VFLOW_VOCAB=N                        # the vocabulary (default 4000)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${VFLOW_BUILD_DIR:-$ROOT/build}"
OUT="${1:-data/fortunes-spm}"
VOCAB="${VFLOW_VOCAB:-4000}"
FORTUNES=/usr/share/games/fortunes

"$ROOT/scripts/dev.sh" deps libsentencepiece-dev fortunes
VFLOW_BUILD_DIR="$BUILD" "$ROOT/scripts/dev.sh" tool vflow-tokenize
# The fortune files at the top level of the folder: the English ones on Debian 12.
mkdir -p "$OUT"
"$BUILD/vflow-tokenize" train --vocab-size "$VOCAB" --model "$OUT/fortunes.model" "$FORTUNES"
"$BUILD/vflow-tokenize" encode --model "$OUT/fortunes.model" --out "$OUT" "$FORTUNES"
