# The planted tests are data for the harness run (they abort on tpu on purpose), never collected here.
collect_ignore = ["planted"]
