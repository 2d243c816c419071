"""The hyper floor's executable, built by cargo: shared by bench/proxybench.py and bench/instructions.py."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def floor_binary(profile="release"):
    """Builds benches/hyper_floor.rs (with cargo's `profile`) and returns its executable."""
    out = subprocess.run(["cargo", "build", "--profile", profile, "--bench", "hyper_floor", "--message-format=json"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "hyper_floor" and msg.get("executable"):
            return msg["executable"]
    sys.exit("cargo built no hyper_floor executable")
