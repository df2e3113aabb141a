"""The desired state the region controller pushes, validated.

`fields` holds every single-value rule and limit, `model` the pydantic models
and the rules across objects, `details` the error details (JSON path and
message) of a rejected body, `parser` the refresh parser that validates only
what changed, `members` the resolved members a listener balances over.
"""
