"""The models the daemon serves: the catalog's models by name in one pool, each owned by its
:class:`~daemon.models.model.Model`, their children, admission, routing, swaps and recycling.
"""
