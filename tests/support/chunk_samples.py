"""Texts the chunking tests cut (tests/unit/test_chunk_*.py): a markdown runbook with
fences, Cisco and Juniper configurations, plain words without punctuation, numbered
sentences, a shell session, and runbooks and sessions of any size; plus picking the
chunks under one heading.
"""

from __future__ import annotations

from collections.abc import Callable

from retrieval.chunking._chunker import Chunk

# --- fixtures ----------------------------------------------------------------------------

NGINX_LINES = [f"    server 10.0.{n // 16}.{n % 16}:8080 max_fails=3 fail_timeout=30s;"
               for n in range(120)]
NESTED_LINES = ["Paste this into the ticket:", "", "```bash", "# not a heading either",
                "systemctl status nginx", "```", "", "Then attach the output."] * 40

RUNBOOK = "\n".join([
    "# Runbooks",
    "",
    "Operational runbooks for the web tier. Each host lists symptoms, checks and fixes.",
    "",
    "## web01",
    "",
    "### Disk full",
    "",
    "Symptoms: nginx answers 500 and `df -h` shows /var at 100%. The access log stops",
    "growing and the load balancer marks the host down after three failed checks. Alerts",
    "fire in this order: disk above 90%, then 5xx rate, then the host-down page.",
    "",
    "First confirm which filesystem is full. On web01 /var is a separate LVM volume, so",
    "the root filesystem can look healthy while /var is not. Do not delete files under",
    "/var/lib/docker by hand! Use the prune commands, or the overlay metadata breaks.",
    "",
    "```bash",
    "# find what grew",
    "du -xh /var | sort -h | tail -20",
    "```",
    "",
    "Usually the culprit is a debug log left on after an incident. Turn the level back",
    "to warn in /etc/app/logging.yaml and reload the service. If the volume is still",
    "above 85% after that, rotate and compress the old logs with logrotate -f, then",
    "check that the cron entry for logrotate is present. If nothing obvious grew, look",
    "for deleted files still held open: lsof +L1 lists them, and restarting the holder",
    "releases the space. As a last resort extend the volume: there are 20 GB free in",
    "the volume group. Record what you did in the incident ticket before closing it.",
    "",
    "Afterwards, check that the alert cleared and that the host is back in the pool. The",
    "load balancer needs two passing checks, which takes about twenty seconds. Then look",
    "at the disk growth graph for the last week to see whether this will happen again.",
    "",
    "### Memory pressure",
    "",
    "Check `free -m` and the OOM killer in `dmesg`. The usual suspect is the JVM heap.",
    "Compare the heap limit in /etc/default/app with the container limit; the heap must",
    "stay at least 512 MB below it. Restart the service only after taking a heap dump.",
    "",
    "web02",
    "-----",
    "",
    "Restart procedure for the load balancer. Drain first, then reload the config below.",
    "",
    '```nginx title="upstream.conf"',
    "upstream app {",
    *NGINX_LINES,
    "}",
    "```",
    "",
    "## Ticket template",
    "",
    "````markdown",
    *NESTED_LINES,
    "````",
    "",
    "## Appendix",
    "",
    "~~~text",
    "captured console output, never closed",
    "# not a heading",
    "## also not a heading",
    "",
])


def cisco_config() -> str:
    """A Cisco IOS export: globals, 48 access ports, a giant ACL, OSPF and vty lines."""
    out = ["!", "! Last configuration change at 10:42:01 UTC Mon Mar 4 2024 by netops", "!",
           "version 15.2", "service timestamps log datetime msec", "hostname core-sw01", "!"]
    for n in range(1, 49):
        out += [f"interface GigabitEthernet1/0/{n}",
                f" description rack{n // 12 + 1} server{n:02d} eth0",
                " switchport access vlan 120",
                " switchport mode access",
                " spanning-tree portfast",
                "!"]
    out.append("ip access-list extended EDGE-IN")
    for n in range(1, 301):
        out.append(f" {n * 10} permit tcp any host 10.1.{n // 250}.{n % 250} eq 443")
    out += [" 9999 deny ip any any log", "!",
            "router ospf 1", " router-id 10.255.0.1", " passive-interface default",
            " network 10.0.0.0 0.255.255.255 area 0", "!",
            "line vty 0 4", " transport input ssh", " login local", "!", "end"]
    return "\n".join(out) + "\n"


def juniper_config() -> str:
    """A Juniper brace-style export whose interfaces block is far larger than max_chars."""
    out = ["## Last commit: 2024-03-04 10:42:01 UTC by netops", "version 20.4R3.8;",
           "system {", "    host-name edge-r1;", "    services {", "        ssh;",
           "        netconf {", "            ssh;", "        }", "    }", "}",
           "interfaces {"]
    for n in range(40):
        out += [f"    ge-0/0/{n} {{", f'        description "uplink {n} {{core}}";',
                "        unit 0 {", "            family inet {",
                f"                address 10.{n}.0.1/30;", "            }", "        }", "    }"]
    out += ["}", "protocols {", "    ospf {", "        area 0.0.0.0 {",
            "            interface ge-0/0/0.0;", "        }", "    }", "}"]
    return "\n".join(out) + "\n"


CISCO = cisco_config()
JUNIPER = juniper_config()

NGINX_STATUS = [
    "\u25cf nginx.service - A high performance web server and a reverse proxy server",
    "     Loaded: loaded (/lib/systemd/system/nginx.service; enabled; preset: enabled)",
    "     Active: active (running) since Mon 2024-03-04 10:42:01 UTC; 3 days ago",
    "",
    *(f"Mar 04 10:42:{n % 60:02d} web01 nginx[{1000 + n}]: worker process {n} started, "
      f"pid {4000 + n}" for n in range(40)),
]


def session() -> str:
    """A transcript: a note, small commands, a long `systemctl status`, a command whose
    output has a blank line, a loop typed over three lines, PowerShell and a venv."""
    return "\n".join([
        "Session on web01, ticket OPS-1234", "",
        "ops@web01:~$ uptime", " 10:42:01 up 3 days,  2:01,  1 user,  load average: 0.10",
        "ops@web01:~$ df -h /var", "Filesystem      Size  Used Avail Use% Mounted on",
        "/dev/sda3        20G   20G     0 100% /var", "",
        "$ systemctl status nginx", *NGINX_STATUS,
        "[root@web01 nginx]# nginx -t", "nginx: the configuration file syntax is ok",
        "", "nginx: configuration file /etc/nginx/nginx.conf test is successful",
        "root@web01:/var/log# for f in *.gz; do", "> rm -- \"$f\"", "> done",
        "PS C:\\Users\\ops> Get-Service nginx", "Status   Name", "Running  nginx",
        "(venv) $ pip list | wc -l", "42", ""])


SESSION = session()

PYTHON = '\n'.join([
    '#!/usr/bin/env python3',
    '"""Restart helpers for the web tier.',
    '',
    'def not_a_function(): this docstring line starts at column 0.',
    '"""',
    'import subprocess',
    'import sys',
    '',
    'TIMEOUT = 30',
    '',
    '',
    '# Restart nginx on one host, retrying.',
    '@retry(times=3)',
    '@log_calls',
    'def restart(host: str,',
    '            timeout: int = TIMEOUT) -> None:',
    '    script = """',
    'systemctl restart nginx',
    'def fake():',
    '"""',
    '    subprocess.run(["ssh", host, script], timeout=timeout, check=True)',
    '',
    '',
    '# Drain a host from the pool.',
    'async def drain(pool, host: str) -> None:',
    '    await pool.remove(host)',
    '    await pool.wait_idle(host)',
    '',
    '',
    'def status(host: str) -> str:',
    '    # ask systemd',
    '    return subprocess.run(["ssh", host, "systemctl", "is-active", "nginx"],',
    '                          capture_output=True, text=True).stdout',
    '',
    '',
    'class Pool(Base):',
    '    """The hosts behind the load balancer."""',
    '',
    '    size = 3',
    '',
    *[line for n in range(12) for line in (
        f'    # check {n}',
        '    @property',
        f'    def check_{n}(self) -> bool:',
        f'        """Whether check {n} passes on every host of the pool."""',
        f'        return all(host.check({n}) for host in self.hosts)',
        '')],
    'if __name__ == "__main__":',
    '    restart(sys.argv[1])',
    ''])

SHELL = '\n'.join([
    '#!/bin/bash',
    '# Deploy helpers.',
    'set -euo pipefail',
    '',
    '# Restart nginx and wait for it.',
    'restart_nginx() {',
    '    local host="$1"',
    '    ssh "$host" \'systemctl restart nginx; echo "}"\'',
    '    cat <<EOF',
    'a } stray brace in a here-document',
    'EOF',
    '    if [ -n "${host}" ]; then { echo ok; }; fi',
    '}',
    '',
    'function deploy {',
    '  echo "deploying $1"  # a } in a comment',
    '}',
    '',
    'oneliner() { echo hi; }',
    '',
    'next_line_brace()',
    '{',
    '  echo "the brace on its own line"',
    '}',
    '',
    'main "$@"',
    ''])



def compose() -> str:
    """A docker-compose YAML file whose ``services.web`` block is far over max_chars:
    comments above keys, a block scalar holding a key-like line, a compact sequence,
    then a second document."""
    out = ["# Compose file for the web tier", 'version: "3.8"', "", "services:",
           "  # the front end", "  web:", "    image: nginx:1.25", "    ports:",
           '    - "80:80"', '    - "443:443"', "    command: |",
           "      nginx -g 'daemon off;'", "      key: not a key", "    environment:"]
    out += [f"      UPSTREAM_{n:03d}: http://10.0.{n // 250}.{n % 250}:8080/health" for n in
            range(120)]
    out += ["  db:", "    image: postgres:16", "    environment:",
            "      POSTGRES_PASSWORD: example", "---", "kind: ConfigMap", "data:",
            "  items:", "    - name: a", "      value: 1", "    - name: b", "      value: 2"]
    return "\n".join(out) + "\n"


def inventory() -> str:
    """A pretty-printed JSON inventory: a small settings member and a big hosts array."""
    hosts = ",\n".join(
        f'    {{\n      "name": "web{n:03d}",\n      "ip": "10.0.{n // 250}.{n % 250}",\n'
        f'      "tags": ["web", "rack{n % 8}"]\n    }}' for n in range(80))
    return ('{\n  "settings": {\n    "region": "eu-west-1",\n    "retries": 3\n  },\n'
            f'  "hosts": [\n{hosts}\n  ],\n  "version": 7\n}}\n')


def pyproject() -> str:
    """A TOML file: root keys, nested tables, a multi-line string that looks like a
    table, a big table, and an array of tables."""
    out = ["# Service settings", 'title = "web"', "owners = [", '  "ops",  # on call',
           '  "dev",', "]", "", "[server]", 'host = "0.0.0.0"', "port = 8080", "",
           "# TLS settings", "[server.tls]", 'cert = "/etc/ssl/web.pem"', 'motd = """',
           "[not.a.table]", 'key = "not a key"', '"""', "", "[upstreams]"]
    out += [f'web{n:03d} = {{ host = "10.0.0.{n}", port = 8080, weight = {n % 5} }}'
            for n in range(60)]
    out += ["", "[[servers]]", 'name = "web01"', "", "[[servers]]", 'name = "web02"']
    return "\n".join(out) + "\n"


COMPOSE = compose()
INVENTORY = inventory()
PYPROJECT = pyproject()


def grown(size: int, piece: Callable[[int], str], head: str = "", tail: str = "") -> str:
    """``head``, then ``piece(0)``, ``piece(1)``, ... until the pieces reach ``size``
    characters, then ``tail``: a sample of about that size."""
    parts = [head]
    total, n = 0, 0
    while total < size:
        parts.append(piece(n))
        total += len(parts[-1])
        n += 1
    parts.append(tail)
    return "".join(parts)


def data_files(size: int) -> str:
    """A YAML file of about ``size`` characters: many services, each with nested keys."""
    def piece(n: int) -> str:
        return (f"  # service {n}\n  svc{n}:\n    image: app:{n}\n    ports:\n"
                f"    - {8000 + n}\n    env:\n      LEVEL: debug\n      ID: '{n}'\n")

    return grown(size, piece, head="services:\n")


def json_files(size: int) -> str:
    """A JSON document of about ``size`` characters: an array of objects."""
    def piece(n: int) -> str:
        return f'  {{"id": {n}, "name": "item{n}",\n   "tags": ["a", "b"]}},\n'

    return grown(size, piece, head='{"items": [\n', tail='  {}\n]}\n')


def toml_files(size: int) -> str:
    """A TOML document of about ``size`` characters: many tables."""
    def piece(n: int) -> str:
        return f'# table {n}\n[svc.s{n}]\nport = {n}\nhosts = [\n  "a",\n  "b",\n]\n\n'

    return grown(size, piece, head='title = "x"\n')


def python_files(size: int) -> str:
    """Python modules of about ``size`` characters: functions, classes, statements."""
    def piece(n: int) -> str:
        return (f"# helper {n}\n@cache\ndef helper_{n}(x: int) -> int:\n"
                f'    """Double {n}."""\n    return x * 2 + {n}\n\n\n'
                f"VALUE_{n} = helper_{n}({n})\n\n\nclass Thing{n}:\n"
                f"    def a(self):\n        return {n}\n\n"
                f"    def b(self):\n        return [\n{n},\n]\n\n\n")

    return grown(size, piece)


def shell_scripts(size: int) -> str:
    """Shell scripts of about ``size`` characters: functions and top-level commands."""
    def piece(n: int) -> str:
        return (f"# step {n}\nstep_{n}() {{\n    echo \"step {n} ${{HOST}}\"\n"
                f"    cat <<EOF\n{n} }}\nEOF\n}}\n\nstep_{n}\n\n")

    return grown(size, piece, head="#!/bin/sh\nset -e\n")

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
PLAIN = "\n\n".join(
    " ".join(f"{WORDS[(p + n) % len(WORDS)]}{n}" for n in range(p * 500, p * 500 + 450))
    for p in range(3))

SENTENCES = "\n\n".join(
    " ".join(f"Step {p}.{n} restarts the {WORDS[n % len(WORDS)]} service and checks it."
             for n in range(40))
    for p in range(3))


# --- helpers -----------------------------------------------------------------------------

def chunks_with_heading(chunks: list[Chunk], heading: str) -> list[Chunk]:
    return [c for c in chunks if c.heading == heading]


# --- performance -------------------------------------------------------------------------

SECTION = """## Host web{n:05d}

### Disk full

When /var fills up, nginx stops writing access logs and the health check fails. Check
usage first. Then find what grew. Rotate the logs if they are the culprit!

```bash
# find big files
du -xh /var | sort -h | tail -20
journalctl --vacuum-size=500M
```

1. Stop the writer.
2. Truncate the file: `: > /var/log/big.log`.
3. Start the writer again and watch `df -h`.

### Memory

Look at `free -m` and the OOM killer in `dmesg`. The usual suspect is the JVM heap.

"""


def sessions(size: int) -> str:
    """Transcripts of about ``size`` characters: many short commands, long outputs."""
    def piece(n: int) -> str:
        lines = [f"ops@web{n:05d}:~$ journalctl -u app --since today | tail -{n % 50}"]
        lines += [f"Mar 04 10:{k % 60:02d} web app[{k}]: request {k} served in {k % 9} ms"
                  for k in range(n % 50)]
        return "\n".join(lines) + "\n"

    return grown(size, piece)


def runbooks(size: int) -> str:
    """Markdown runbooks of about ``size`` characters."""
    return grown(size, lambda n: SECTION.format(n=n), head="# Runbooks\n\n")
