#!/usr/bin/env bash
# Gradescope autograder image setup (runs once, as root, when Gradescope builds the image; network allowed).
# Installs Python, a CPU build of torch and the course package shipped in this bundle (source/course), with the
# grader's dependencies (the [test] extra: nbclient, nbformat, ipykernel).
set -euo pipefail
apt-get install -y python3 python3-pip python3-venv
python3 -m venv /autograder/venv
/autograder/venv/bin/python -m pip install --upgrade pip
/autograder/venv/bin/python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/python -m pip install "/autograder/source/course[test]"
