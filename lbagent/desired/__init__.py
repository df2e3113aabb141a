"""The desired state the region controller pushes, validated.

`fields` holds every single-value rule and limit, `model` the pydantic
models, `crosschecks` the rules across objects, `listener_types` what each
listener type means and may carry, `details` the error details (JSON path and
message) of a rejected body, `parser` the refresh parser that validates only
what changed, `members` the resolved members a listener balances over.
"""
