"""Run Hugging Face's test suites on a TPU (real or emulated) beside a CPU baseline: reports in the
ecosystem's formats, TPU-only failures triaged by evidence, a repro per failure bucket.

``python -m ci --help``; docs/harness.md.
"""
