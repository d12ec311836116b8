"""External OpenAI-compatible endpoints: their client, and how the supervisor "launches" and
watches one.
"""
