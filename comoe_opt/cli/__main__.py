"""`python -m comoe_opt.cli`: the same as the `comoe-opt` command."""

from comoe_opt.cli import run

run()
