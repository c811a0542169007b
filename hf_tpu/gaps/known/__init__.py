"""The known gaps, one module each: its ``GAP`` record and its ``PROBE`` script (``hf_tpu.gaps`` finds them)."""
