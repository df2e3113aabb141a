"""The benchmark (`make bench`): see bench/run.py.

`bench/policy_rules.py` is a separate, older measurement (what per-load-balancer
policy rules cost the host); run.py calls it and reports its figures.
"""
