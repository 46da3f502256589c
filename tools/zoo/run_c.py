"""Run every zoo_c layer through the zoo_b harness (explain, optimize, forward + gradient exactness).

Usage: python tools/zoo/run_c.py [layer ...]  -> prints and writes results_c.txt
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_b  # noqa: E402
import zoo_c  # noqa: E402

if __name__ == "__main__":
    run_b.main(sys.argv[1:], zoo=zoo_c, results="results_c")
