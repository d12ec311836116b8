"""What llamad tells its operator: structured logs and their rate limit, Prometheus metrics,
audit logs.
"""
