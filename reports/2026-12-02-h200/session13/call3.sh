#!/bin/bash
# Session 13, call 3: call2.sh again, on the tree of 9b0f121 (the FP8 gather staged three tiles
# ahead: 2 ring stages, 4 staging buffers).
exec "$(dirname "$0")/call2.sh"
