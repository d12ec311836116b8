"""The fake services behind :class:`clients.testing.FakeLlamad`."""
