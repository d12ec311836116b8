"""Operations around the serving: the administrative drain, configuration reload (SIGHUP),
systemd, the state directory's lock, the metrics endpoint and the store migration command.
"""
