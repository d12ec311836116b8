"""Requests checked before they reach a child: every field against a named limit, tools, and
what a grammar or a JSON schema may cost.
"""
