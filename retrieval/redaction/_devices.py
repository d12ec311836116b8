"""Network device configuration: Cisco IOS/NX-OS/ASA, Juniper, SNMP (v1/v2c and v3).

Secrets here follow a keyword and a space, not a separator: ``enable secret 5 $1$...``,
``snmp-server user NMS GRP v3 auth sha AUTHPASS priv aes 128 PRIVPASS``. Each statement
has its own rule, so that prose using the same words ("a password 6 characters long")
keeps them.
"""

from __future__ import annotations

import re

from ._base import M, Rule, lead, line_has, rule


def _cisco_type_accept(m: re.Match[str]) -> bool:
    """"password 7 <hex>", "secret 5 $1$...": the type digit says what the value looks like."""
    digit, value = m.group("t"), m.group("v")
    if digit == "7":
        return re.fullmatch(r"[0-9A-Fa-f]{4,}", value) is not None
    if digit in "589":
        return value.startswith("$")
    if digit == "6":  # AES-encrypted: long, not a word ("password 6 characters")
        return len(value) >= 16 and not value.isalpha()
    return digit == "0"


def _password_or_secret(m: re.Match[str]) -> str:
    return "password" if "password" in m.group("k").lower() else "secret"


_JUNIPER_HASHED = frozenset({"secret", "password"})

CISCO_RULES: tuple[Rule, ...] = (
    # enable secret 5 $1$...; enable password [level 15] [7] cisco
    rule(r"^(?P<p>[ \t]*+enable[ \t]++(?:secret|password)(?:[ \t]++level[ \t]++\d++)?"
         r"(?:[ \t]++[0-9](?=[ \t]))?[ \t]++)(?P<v>\S++)",
         "password", ("enable",), flags=M),
    # username admin [privilege 15] secret 9 $9$... / password 7 0822455D0A16
    rule(r"^(?P<p>[ \t]*+username[ \t]++\S++(?:[ \t]++(?!(?:password|secret)\b)\S++)*?"
         r"[ \t]++(?:password|secret)(?:[ \t]++[0-9](?=[ \t]))?[ \t]++)(?P<v>\S++)",
         "password", ("username",), flags=M),
    # Juniper: encrypted-password "$6$..."; authentication-key "$9$..."; ascii-text "...";
    # SNMPv3 authentication-password / privacy-password "...". A bare secret/password
    # keyword needs a hash-shaped value: 'the secret "sauce"' stays.
    rule(r"(?P<k>" + lead("encrypted-password", "simple-password", "authentication-password",
                          "privacy-password", "password", "authentication-key", "ascii-text",
                          "hexadecimal", "secret") + r")[ \t]++\"(?P<v>[^\"\n]++)\"",
         _password_or_secret,
         ("password", "authentication-key", "ascii-text", "hexadecimal", "secret"),
         accept=lambda m: m.group("k") not in _JUNIPER_HASHED or m.group("v").startswith("$")),
    # "password 7 <hex>" / "secret 5 $1$..." anywhere on a line (neighbor, line, user).
    rule(r"(?P<k>" + lead("password", "secret") + r")[ \t]++(?P<t>[0-9])[ \t]++(?P<v>\S++)",
         _password_or_secret, ("password", "secret"), accept=_cisco_type_accept),
    # neighbor 10.0.0.1 password <pw>
    rule(lead("neighbor") + r"[ \t]++\S++[ \t]++password[ \t]++(?:[0-9][ \t]++)?(?P<v>\S++)",
         "password", ("neighbor",)),
    # An indented "password <pw>" / "secret <pw>" / "key <k>" line in a config block
    # (line vty, tacacs server, .netrc entries, ...). The value is the last token of the
    # line. (" key 1" under "key chain" is a key number, not a key.)
    rule(r"^[ \t]++(?P<k>password|secret|key)[ \t]++(?:[0-9][ \t]++)?(?P<v>\S++)[ \t]*+$",
         lambda m: "password" if m.group("k") == "password" else "secret",
         ("password", "secret", "key"), flags=M,
         accept=lambda m: m.group("k") != "key" or not m.group("v").isdigit()),
    rule(lead("key-string") + r"[ \t]++(?:[0-9][ \t]++)?(?P<v>\S++)", "secret", ("key-string",)),
    rule(lead("pre-shared-key") + r"(?:[ \t]++(?:local|remote))?"
         r"(?:[ \t]++address[ \t]++\S++(?:[ \t]++\d++\.\d++\.\d++\.\d++)?)?"
         r"(?:[ \t]++hostname[ \t]++\S++)?(?:[ \t]++key)?(?:[ \t]++[0-9](?=[ \t]))?"
         r"[ \t]++(?P<v>\S++)",
         "secret", ("pre-shared-key",),
         accept=lambda m: m.group("v").lower() not in {"ascii-text", "hexadecimal"}),
    rule(lead("crypto") + r"[ \t]++isakmp[ \t]++key[ \t]++(?:[0-9][ \t]++)?(?P<v>\S++)",
         "secret", ("isakmp",)),
    rule(r"^[ \t]*+(?:tacacs-server|radius-server)(?:[ \t]++(?!key\b)\S++)*?[ \t]++key"
         r"[ \t]++(?:[0-9][ \t]++)?(?P<v>\S++)",
         "secret", ("tacacs-server", "radius-server"), flags=M),
    # ntp authentication-key 1 md5 <k>; ip ospf message-digest-key 1 md5 [7] <k>
    rule(lead("authentication-key", "message-digest-key") + r"[ \t]++(?:\d++[ \t]++)?"
         r"(?:md5[ \t]++)?(?:[0-9][ \t]++)?(?P<v>\S++)",
         "secret", ("authentication-key", "message-digest-key")),
)

_V3_AUTH = r"(?:md5|sha(?:-?(?:224|256|384|512))?)"
_V3_PRIV = r"(?:des|3des|des56|aes(?:-?(?:128|192|256))?(?:[ \t]++(?:128|192|256))?)"

SNMP_RULES: tuple[Rule, ...] = (
    # snmp-server community <name> RO|RW; snmp-server host <h> [traps] [version 2c] <name>
    rule(lead("snmp-server") + r"[ \t]++community[ \t]++(?:[0-9][ \t]++)?(?P<v>\S++)",
         "snmp_community", ("snmp-server",)),
    rule(lead("snmp-server") + r"[ \t]++host[ \t]++\S++(?:[ \t]++(?:informs|traps))?"
         r"(?:[ \t]++version[ \t]++(?:1|2c|3[ \t]++\S++))?[ \t]++(?P<v>\S++)",
         "snmp_community", ("snmp-server",),
         accept=lambda m: m.group("v").lower() not in {"informs", "traps", "version"}),
    # Juniper: community public { authorization read-only; }  /  set snmp community public
    rule(r"^[ \t]*+(?:set[ \t]++snmp[ \t]++)?community[ \t]++(?P<v>\"[^\"\n]*+\"|[^\s{;]++)",
         "snmp_community", ("community",), flags=M),
    # SNMPv3 users (Cisco): snmp-server user NAME GROUP [remote H [udp-port N]] v3
    # [encrypted] auth sha AUTHPASS [priv aes 128 PRIVPASS] [access ACL]
    rule(lead("snmp-server") + r"[ \t]++user[ \t]++\S++[ \t]++\S++"
         r"(?:[ \t]++remote[ \t]++\S++(?:[ \t]++udp-port[ \t]++\d++)?)?[ \t]++v3"
         r"(?:[ \t]++encrypted)?[ \t]++auth[ \t]++" + _V3_AUTH + r"[ \t]++(?P<v>\S++)",
         "snmp_auth", ("snmp-server",)),
    # ... and the privacy password after it, wherever "priv <cipher>" is on the line of one.
    rule(lead("priv") + r"[ \t]++" + _V3_PRIV + r"[ \t]++(?P<v>\S++)", "snmp_auth", ("priv",),
         flags=re.IGNORECASE, accept=line_has(("snmp-server", "snmp", "user"))),
    # net-snmp: createUser [-e ENGINE] NAME (MD5|SHA...) AUTHPASS [DES|AES PRIVPASS]
    rule(lead("createuser") + r"[ \t]++(?:-e[ \t]++\S++[ \t]++)?\S++[ \t]++" + _V3_AUTH
         + r"[ \t]++\"?(?P<v>[^\s\"]++)", "snmp_auth", ("createuser",), flags=re.IGNORECASE),
    rule(lead("createuser") + r"[ \t]++(?:-e[ \t]++\S++[ \t]++)?\S++[ \t]++" + _V3_AUTH
         + r"[ \t]++\"?[^\s\"]++\"?[ \t]++(?:des|aes(?:-?(?:128|192|256))?)[ \t]++\"?"
         r"(?P<v>[^\s\"]++)", "snmp_auth", ("createuser",), flags=re.IGNORECASE),
    # snmpd.conf: rocommunity/rwcommunity NAME [SOURCE]; com2sec NAME SOURCE COMMUNITY
    rule(r"^[ \t]*+r[ow]community6?[ \t]++(?P<v>\S++)", "snmp_community",
         ("rocommunity", "rwcommunity"), flags=M),
    rule(r"^[ \t]*+com2sec6?[ \t]++(?:-Cn[ \t]++\S++[ \t]++)?\S++[ \t]++\S++[ \t]++"
         r"(?P<v>\S++)",
         "snmp_community", ("com2sec",), flags=M),
    # net-snmp command lines: snmpwalk -v2c -c COMMUNITY / -v3 ... -A AUTHPASS -X PRIVPASS
    rule(r"(?P<f>" + lead("-c", "-A", "-X") + r")[ \t]*+(?P<v>[^\s-]\S*+)",
         lambda m: "snmp_community" if m.group("f") == "-c" else "snmp_auth", ("snmp",),
         accept=line_has(("snmpwalk", "snmpget", "snmpbulk", "snmpset", "snmptrap",
                          "snmptable", "snmpinform", "snmpstatus", "snmpdf", "snmpnetstat",
                          "snmpdelta", "snmptest", "snmpusm", "snmpvacm"))),
)
