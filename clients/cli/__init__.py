"""The client verbs of the ``llamad`` command: one function per verb, their flags and their
output.
"""
