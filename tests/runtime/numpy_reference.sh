#!/usr/bin/env bash
# numpy_ref.py check over the transformers fixtures (it must agree with
# transformers) and over its own fixtures (they must be what it computes).
set -u
for py in /usr/bin/python3 python3; do
  if "$py" -c "import numpy" 2>/dev/null; then
    exec "$py" tools/fixtures/numpy_ref.py check tests/data/fixtures/transformers/*/ tests/data/fixtures/numpy/*/
  fi
done
echo "numpy is not installed (Debian: python3-numpy): numpy_reference skipped"
exit 77
