"""Redaction of the shapes added for issue 18 (part 2), in command lines and device
configurations: curl users, mysql and other commands' password flags, SQL passwords, SNMPv3
users and communities (net-snmp, Juniper); one test per shape, each with the exact output.
"""

from __future__ import annotations

from retrieval.redaction._redactor import redact
from tests.support.redaction import P, check

# --- command lines -------------------------------------------------------------------------


def test_curl_user_password() -> None:
    """curl -u/--user user:password loses the password, also on a continued line; uid:gid
    for docker and -u without a colon stay."""
    check("curl -u admin:S3cr3t-pw https://api/x", f"curl -u admin:{P('password')} https://api/x",
          {"password": 1})
    check("curl --user 'deploy:pa ss' https://x", f"curl --user 'deploy:{P('password')}' https://x",
          {"password": 1})
    check("curl \\\n  -H 'Accept: */*' \\\n  --user bot:Hunter2x \\\n  https://x",
          f"curl \\\n  -H 'Accept: */*' \\\n  --user bot:{P('password')} \\\n  https://x",
          {"password": 1})
    for text in ("docker run -u 1000:1000 app", "curl -u admin https://x", "ps -u root:x"):
        assert redact(text).text == text


def test_mysql_password_flags() -> None:
    """mysql -pPASS and --password=PASS lose the password; -p alone (a prompt) stays."""
    check("mysql -uroot -pHunter2x app", f"mysql -uroot -p{P('password')} app", {"password": 1})
    check("mysqldump -u b -p'pa ss' db", f"mysqldump -u b -p{P('password')} db", {"password": 1})
    check("mysql --password=Hunter2x -h db", f"mysql --password={P('password')} -h db",
          {"password": 1})
    assert redact("mysql -p app").counts == {}


def test_password_flags_of_other_commands() -> None:
    """sshpass -p, docker login -p, redis-cli -a, openssl pass:, keytool -storepass,
    htpasswd -b, net user, smbclient -U user%pass and xfreerdp /p: lose their password."""
    for text, expected in (
        ("sshpass -p 'Pw0rd!' ssh host", f"sshpass -p {P('password')} ssh host"),
        ("docker login -u ci -p Pw0rd1 reg", f"docker login -u ci -p {P('password')} reg"),
        ("redis-cli -h c -a Pw0rd1 ping", f"redis-cli -h c -a {P('password')} ping"),
        ("openssl pkcs12 -export -passout pass:Pw0rd1 -out a.p12",
         f"openssl pkcs12 -export -passout pass:{P('password')} -out a.p12"),
        ("keytool -list -storepass Pw0rd1", f"keytool -list -storepass {P('password')}"),
        ("htpasswd -bc /etc/h admin Pw0rd1", f"htpasswd -bc /etc/h admin {P('password')}"),
        ("htpasswd -nb admin Pw0rd1", f"htpasswd -nb admin {P('password')}"),
        ("net user svc Pw0rd1 /add", f"net user svc {P('password')} /add"),
        ("smbclient //fs/s -U admin%Pw0rd1", f"smbclient //fs/s -U admin%{P('password')}"),
        ("xfreerdp /u:admin /p:Pw0rd1 /v:h", f"xfreerdp /u:admin /p:{P('password')} /v:h"),
    ):
        check(text, expected, {"password": 1})
    assert redact("ssh -p 2222 admin@host").counts == {}


def test_sql_passwords() -> None:
    """SQL IDENTIFIED BY, WITH PASSWORD and = PASSWORD('...') lose the password; prose
    "identified by its hash" stays."""
    check("CREATE USER app IDENTIFIED BY 'Pw0rd1';",
          f"CREATE USER app IDENTIFIED BY '{P('password')}';", {"password": 1})
    check("CREATE USER scott IDENTIFIED BY tiger;",
          f"CREATE USER scott IDENTIFIED BY {P('password')};", {"password": 1})
    check("ALTER ROLE app WITH PASSWORD 'Pw0rd1';",
          f"ALTER ROLE app WITH PASSWORD '{P('password')}';", {"password": 1})
    check("SET PASSWORD FOR 'a'@'%' = PASSWORD('Pw0rd1');",
          f"SET PASSWORD FOR 'a'@'%' = PASSWORD('{P('password')}');", {"password": 1})
    assert redact("the user was identified by its hash").counts == {}


# --- device configuration ------------------------------------------------------------------


def test_snmpv3_user() -> None:
    """Cisco snmp-server user ... v3 auth sha AUTH priv aes 128 PRIV loses both passwords."""
    check("snmp-server user NMS NMSGROUP v3 auth sha AuthPw9x priv aes 128 PrivPw9x",
          f"snmp-server user NMS NMSGROUP v3 auth sha {P('snmp_auth')} priv aes 128 "
          f"{P('snmp_auth')}", {"snmp_auth": 2})


def test_net_snmp_users_and_communities() -> None:
    """net-snmp createUser, rocommunity, com2sec and snmpwalk -c/-A/-X lose their secrets."""
    check('createUser nms SHA "AuthPw9x" AES "PrivPw9x"',
          f'createUser nms SHA "{P("snmp_auth")}" AES "{P("snmp_auth")}"', {"snmp_auth": 2})
    check("rocommunity N0tPublic 10.0.0.0/8", f"rocommunity {P('snmp_community')} 10.0.0.0/8",
          {"snmp_community": 1})
    check("com2sec local localhost S3cretC", f"com2sec local localhost {P('snmp_community')}",
          {"snmp_community": 1})
    check("snmpwalk -v3 -u n -l authPriv -a SHA -A AuthPw9x -x AES -X PrivPw9x h",
          f"snmpwalk -v3 -u n -l authPriv -a SHA -A {P('snmp_auth')} -x AES -X "
          f"{P('snmp_auth')} h", {"snmp_auth": 2})


def test_juniper_snmpv3_passwords() -> None:
    """Juniper authentication-password and privacy-password lose their value."""
    check('authentication-password "AuthPw9x";\nprivacy-password "PrivPw9x";',
          f'authentication-password "{P("password")}";\nprivacy-password "{P("password")}";',
          {"password": 2})
