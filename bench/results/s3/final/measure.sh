#!/bin/bash
# Round 3's run of every scenario: round 2's script, base = round-3 start 5cd8a55 (/tmp/bm/cur),
# new = 0d43c49 (/tmp/s3/new6), whose bench tool ran the load.
BASE_BIN=/tmp/bm/cur NEW_BIN=/tmp/s3/new6 BENCH=/tmp/s3/new6 OUT=/tmp/s3/out exec "$(dirname "$0")/../../s2/measure.sh"
