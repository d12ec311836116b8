"""Redaction of the shapes added for issue 18 (part 2): one test per shape, each with the
exact output; then linear time on hostile megabytes built for the new rules.

Every secret here is fake and assembled at run time (prefix + generated body), so no
literal in this file looks like a live credential to a secret scanner.
"""

from __future__ import annotations

import base64
import random
import string
from collections.abc import Callable

import pytest

from retrieval._redact import Redacted, redact
from tests.support.scaling import assert_linear

_rng = random.Random(20261201)
ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
P = "[REDACTED:{}]".format


def body(alphabet: str, n: int) -> str:
    """``n`` characters of ``alphabet`` with an upper, a lower case letter and a digit where
    the alphabet has them (real tokens do)."""
    while True:
        s = "".join(_rng.choice(alphabet) for _ in range(n))
        if all(not (set(c) & set(alphabet)) or set(c) & set(s)
               for c in (string.ascii_uppercase, string.ascii_lowercase, string.digits)):
            return s


def check(text: str, expected: str, counts: dict[str, int]) -> None:
    got = redact(text)
    assert got == Redacted(text=expected, counts=counts)
    assert redact(got.text) == Redacted(text=got.text, counts={})


# --- provider tokens -------------------------------------------------------------------------

TOKENS: list[tuple[str, str, str]] = [  # id, token, placeholder type
    ("stripe-live", "sk" + "_live_" + body(ALNUM, 24), "stripe_key"),
    ("stripe-restricted", "rk" + "_live_" + body(ALNUM, 24), "stripe_key"),
    ("stripe-test", "sk" + "_test_" + body(ALNUM, 24), "stripe_key"),
    ("stripe-webhook", "wh" + "sec_" + body(ALNUM, 32), "stripe_key"),
    ("gitlab-pat", "gl" + "pat-" + body(ALNUM + "_-", 20), "gitlab_token"),
    ("gitlab-deploy", "gl" + "dt-" + body(ALNUM, 20), "gitlab_token"),
    ("npm", "np" + "m_" + body(ALNUM, 36), "npm_token"),
    ("sendgrid", "S" + "G." + body(ALNUM, 22) + "." + body(ALNUM + "-_", 43), "sendgrid_key"),
    ("twilio-api-key", "S" + "K" + body(HEX, 32), "twilio_key"),
    ("twilio-account-sid", "A" + "C" + body(HEX, 32), "twilio_sid"),
    ("google-oauth-secret", "GOC" + "SPX-" + body(ALNUM, 28), "gcp_key"),
    ("google-access-token", "ya" + "29." + body(ALNUM + "-_", 80), "gcp_key"),
    ("huggingface", "h" + "f_" + body(ALNUM, 34), "huggingface_token"),
    ("anthropic", "sk-" + "ant-api03-" + body(ALNUM + "-_", 93) + "AA", "anthropic_key"),
    ("shopify", "shp" + "at_" + body(HEX, 32), "shopify_token"),
    ("mailgun", "ke" + "y-" + body(ALNUM, 32), "mailgun_key"),
    ("pypi", "py" + "pi-AgEIcHlwaS5vcmc" + body(ALNUM + "-_", 70), "pypi_token"),
    ("digitalocean", "do" + "p_v1_" + body(HEX, 64), "digitalocean_token"),
    ("atlassian", "ATA" + "TT3" + body(ALNUM + "-_", 180), "atlassian_token"),
    ("heroku", "HR" + "KU-AA" + body(ALNUM + "-_", 58), "heroku_key"),
    ("square-access", "sq0" + "atp-" + body(ALNUM + "-_", 22), "square_token"),
    ("square-production", "EA" + "AA" + body(ALNUM + "-_", 60), "square_token"),
    ("azure-ad-client-secret", body(ALNUM, 3) + "8Q~" + body(ALNUM + "_~.-", 34),
     "azure_key"),
    ("vault", "hv" + "s." + body(ALNUM + "-_", 90), "vault_token"),
    ("vault-legacy", "s." + body(ALNUM, 24), "vault_token"),
    ("sentry", "sntry" + "u_" + body(HEX, 64), "sentry_token"),
    ("grafana", "gl" + "sa_" + body(ALNUM, 32) + "_" + body(HEX, 8), "grafana_token"),
    ("databricks", "da" + "pi" + body(HEX, 32), "databricks_token"),
    ("postman", "PM" + "AK-" + body(HEX, 24) + "-" + body(HEX, 34), "postman_key"),
    ("newrelic", "NR" + "AK-" + body(string.ascii_uppercase + string.digits, 27),
     "newrelic_key"),
    ("doppler", "dp" + ".pt." + body(ALNUM, 43), "doppler_token"),
    ("linear", "lin" + "_api_" + body(ALNUM, 40), "linear_key"),
    ("notion", "ntn" + "_" + body(ALNUM, 46), "notion_token"),
    ("alibaba", "LT" + "AI" + body(ALNUM, 20), "alibaba_key"),
    ("artifactory", "AK" + "Cp" + body(ALNUM, 69), "artifactory_key"),
    ("age", "AGE-" + "SECRET-KEY-1" + body(string.ascii_uppercase + string.digits, 58),
     "age_key"),
    ("terraform", body(ALNUM, 14) + ".atlas" + "v1." + body(ALNUM + "-_", 67), "terraform_token"),
    ("mailchimp", body(HEX, 32) + "-us" + "14", "mailchimp_key"),
    ("firebase", "AA" + "AA" + body(ALNUM, 7) + ":APA91b" + body(ALNUM + "-_", 134), "gcp_key"),
    ("discord-bot", base64.b64encode(b"123456789012345678").decode().rstrip("=") + "."
     + body(ALNUM, 6) + "." + body(ALNUM + "-_", 38), "discord_token"),
    ("telegram-bot", "4" + body(string.digits, 8) + ":A" + "A" + body(ALNUM + "-_", 33),
     "telegram_token"),
]


@pytest.mark.parametrize(("token", "kind"), [(t, k) for _, t, k in TOKENS],
                         ids=[i for i, _, _ in TOKENS])
def test_provider_token_anywhere(token: str, kind: str) -> None:
    """A provider token is replaced by its type's placeholder wherever it stands, the text
    around it kept."""
    check(f"use {token} for the job", f"use {P(kind)} for the job", {kind: 1})
    check(f'"{token}"', f'"{P(kind)}"', {kind: 1})


def test_identifiers_sharing_token_prefixes_survive() -> None:
    """Words that start like tokens (hf_hub_download, npm_config_x, sk_test_mode, key-value,
    SGDClassifier, a camelCase name after hf_) are no tokens."""
    for text in ("hf_hub_download(repo)", "npm_config_registry=https://r.example/",
                 "sk_test_mode_enabled = True", "key-value-store-configuration-for-tenants",
                 "SGDClassifier.fit(X, y)", "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",
                 "stripe sk_live_integrationTestsForPayments", "s.getAttributeValueFromNode"):
        assert redact(text).text == text


def test_discord_bot_token_needs_a_numeric_id() -> None:
    """Three dotted base64 parts are a Discord bot token only if the first encodes the bot's
    numeric id."""
    fake = base64.b64encode(b"not-a-user-id-xyz").decode().rstrip("=")
    text = f"M{fake[1:]}.{body(ALNUM, 6)}.{body(ALNUM, 30)}"
    assert redact(text).text == text


def test_twilio_auth_token_in_assignment() -> None:
    """A Twilio auth token (32 hex) is redacted as the value of its assignment."""
    token = body(HEX, 32)
    check(f"TWILIO_AUTH_TOKEN={token}", f"TWILIO_AUTH_TOKEN={P('secret')}", {"secret": 1})


def test_datadog_app_key_in_assignment() -> None:
    """Keys named app_key or application_key (Datadog, Laravel) are credentials."""
    check(f"DD_APP_KEY={body(HEX, 40)}\ndatadog_application_key: {body(HEX, 40)}",
          f"DD_APP_KEY={P('secret')}\ndatadog_application_key: {P('secret')}", {"secret": 2})


# --- cloud connection strings and service accounts -----------------------------------------


def test_azure_storage_connection_string() -> None:
    """AccountKey in an Azure storage connection string is redacted, the rest kept."""
    key = base64.b64encode(_rng.randbytes(64)).decode()
    check(f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={key};EndpointSuffix=x",
          f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={P('azure_key')};"
          "EndpointSuffix=x", {"azure_key": 1})


def test_azure_sas_signature() -> None:
    """The sig of a shared access signature URL, and a SharedAccessSignature, are redacted."""
    sig = base64.b64encode(_rng.randbytes(32)).decode().replace("+", "%2B").replace("/", "%2F")
    check(f"https://a.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig={sig}&x=1",
          f"https://a.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig={P('url_signature')}&x=1",
          {"url_signature": 1})
    check(f"BlobEndpoint=https://a/;SharedAccessSignature=sv=2022&sig={sig}",
          f"BlobEndpoint=https://a/;SharedAccessSignature={P('azure_key')}", {"azure_key": 1})


def test_gcp_service_account_json() -> None:
    """In a GCP service-account key file the private_key_id and the private key go."""
    key_id = body(HEX, 40)
    pem = "\\n".join(["-----BEGIN PRIVATE KEY-----", body(ALNUM + "+/", 64),
                      body(ALNUM + "+/", 20), "-----END PRIVATE KEY-----"])
    check(f'{{"private_key_id": "{key_id}", "private_key": "{pem}\\n", "client_email": "a@b"}}',
          f'{{"private_key_id": "{P("gcp_key")}", "private_key": "{P("private_key")}\\n", '
          '"client_email": "a@b"}', {"gcp_key": 1, "private_key": 1})


def test_kubeconfig_client_key_and_token() -> None:
    """A kubeconfig's client-key-data and token are redacted; its certificate data is not."""
    cert = base64.b64encode(b"public certificate bytes").decode()
    key = base64.b64encode(_rng.randbytes(90)).decode()
    token = body(ALNUM + "-_", 40)
    text = (f"    client-certificate-data: {cert}\n    client-key-data: {key}\n"
            f"    token: {token}\n")
    check(text, f"    client-certificate-data: {cert}\n    client-key-data: {P('private_key')}\n"
          f"    token: {P('secret')}\n", {"private_key": 1, "secret": 1})


def test_docker_config_auth() -> None:
    """Docker's config.json "auth" (base64 of user:password) is redacted; "auth": "required"
    is not."""
    auth = base64.b64encode(b"ci:" + body(ALNUM, 14).encode()).decode()
    check(f'{{"auths": {{"registry": {{"auth": "{auth}"}}}}}}',
          f'{{"auths": {{"registry": {{"auth": "{P("secret")}"}}}}}}', {"secret": 1})
    assert redact("auth: required").text == "auth: required"


# --- keys and hashes -----------------------------------------------------------------------


def test_putty_private_key() -> None:
    """A PuTTY .ppk file is redacted from its first line through Private-MAC."""
    ppk = ("PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: k\n"
           f"Public-Lines: 2\n{body(ALNUM + '+/', 64)}\n{body(ALNUM, 20)}\nPrivate-Lines: 1\n"
           f"{body(ALNUM + '+/', 48)}\nPrivate-MAC: {body(HEX, 64)}")
    check(f"id.ppk:\n{ppk}\nnext", f"id.ppk:\n{P('private_key')}\nnext", {"private_key": 1})


@pytest.mark.parametrize("dash", ["\u2014\u2013", "\u2013" * 5, "\u2010" * 5, "\u2212" * 5,
                                  "\uff0d" * 5, "\u2015\u2015", "--"])
def test_pem_block_with_unicode_dashes(dash: str) -> None:
    """A private key whose armor dashes became en/em dashes, minus signs or full-width
    hyphens is still a private key, and the text around it keeps its characters."""
    block = (f"{dash}BEGIN RSA PRIVATE KEY{dash}\n{body(ALNUM + '+/', 64)}\n"
             f"{dash}END RSA PRIVATE KEY{dash}")
    check(f"wiki \u2014 paste:\n{block}\nend", f"wiki \u2014 paste:\n{P('private_key')}\nend",
          {"private_key": 1})


def test_truncated_pem_block_stops_at_the_next_one() -> None:
    """A truncated private key (no END) followed later by a whole one: both go, the text
    between them stays."""
    key = body(ALNUM + "+/", 64)
    head, tail = "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----"
    check(f"{head}\n{key}\n\nNext step: restart nginx.\n\n{head}\n{key}\n{tail}\nend",
          f"{P('private_key')}\n\nNext step: restart nginx.\n\n{P('private_key')}\nend",
          {"private_key": 2})


def test_shadow_lines() -> None:
    """/etc/shadow lines lose their hash (sha512-crypt, yescrypt, DES), keep user and dates;
    locked and empty entries stay."""
    sha = "$6$" + body(ALNUM, 16) + "$" + body(ALNUM + "./", 86)
    yes = "$y$j9T$" + body(ALNUM, 22) + "$" + body(ALNUM + "./", 43)
    des = body(ALNUM + "./", 13)
    check(f"root:{sha}:19000:0:99999:7:::\nbob:{yes}:19100:0:99999:7:::\n"
          f"old:{des}:18000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\nnobody:!:19000::::::",
          f"root:{P('password_hash')}:19000:0:99999:7:::\nbob:{P('password_hash')}:19100:0:"
          f"99999:7:::\nold:{P('password_hash')}:18000:0:99999:7:::\ndaemon:*:19000:0:99999:7"
          ":::\nnobody:!:19000::::::", {"password_hash": 3})


def test_htpasswd_lines() -> None:
    """htpasswd lines lose their hash: apr1, {SHA}, bcrypt."""
    apr = "$apr1$" + body(ALNUM, 8) + "$" + body(ALNUM + "./", 22)
    sha = "{SHA}" + base64.b64encode(_rng.randbytes(20)).decode()
    bcrypt = "$2y$10$" + body(ALNUM + "./", 53)
    check(f"admin:{apr}\nalice:{sha}\nops@example.com:{bcrypt}",
          f"admin:{P('password_hash')}\nalice:{P('password_hash')}\n"
          f"ops@example.com:{P('password_hash')}", {"password_hash": 3})


def test_crypt_hash_anywhere() -> None:
    """A modular-crypt or LDAP-scheme hash is redacted wherever it is; $1$2 in shell is not."""
    argon = "$argon2id$v=19$m=65536,t=3,p=4$" + body(ALNUM, 22) + "$" + body(ALNUM, 43)
    ssha = "{SSHA}" + base64.b64encode(_rng.randbytes(24)).decode()
    check(f"stored {argon} and {ssha}.",
          f"stored {P('password_hash')} and {P('password_hash')}.", {"password_hash": 2})
    assert redact("echo $1$2$3; awk '{print $1$2}'").counts == {}


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


# --- files and markup ----------------------------------------------------------------------


def test_xml_elements_and_attributes() -> None:
    """<password>, <secret>, <apiKey> elements (CDATA too) and password="..." or
    name="password" value="..." attributes lose their value; references stay."""
    check("<db><password>Pw0rd1!</password><apiKey>k3y9</apiKey></db>",
          f"<db><password>{P('password')}</password><apiKey>{P('api_key')}</apiKey></db>",
          {"password": 1, "api_key": 1})
    check("<secret><![CDATA[Pw0rd1!]]></secret>", f"<secret><![CDATA[{P('secret')}]]></secret>",
          {"secret": 1})
    check('<user name="admin" password="Pw0rd1"/>',
          f'<user name="admin" password="{P("password")}"/>', {"password": 1})
    check('<add key="DbPassword" value="Pw0rd1" />', f'<add key="DbPassword" value="'
          f'{P("password")}" />', {"password": 1})
    for text in ("<password>${db.password}</password>", "<password/> is the element",
                 '<property name="password" value="${pw}"/>'):
        assert redact(text).text == text


def test_code_assignments() -> None:
    """os.environ["X_PASSWORD"] = ..., PHP define('DB_PASSWORD', ...) and setPassword("...")
    lose their literal."""
    check("os.environ['DB_PASSWORD'] = 'Pw0rd1'", f"os.environ['DB_PASSWORD'] = '{P('password')}'",
          {"password": 1})
    check("define('DB_PASSWORD', 'Pw0rd1');", f"define('DB_PASSWORD', '{P('password')}');",
          {"password": 1})
    check('ds.setPassword("Pw0rd1");', f'ds.setPassword("{P("password")}");', {"password": 1})


def test_dotfiles_and_service_configs() -> None:
    """.pgpass, .netrc, redis.conf, slapd/nslcd and LDIF passwords are redacted; an IPv6
    address or a time with colons is no .pgpass line."""
    check("db01:5432:app:app_user:Pw0rd1", f"db01:5432:app:app_user:{P('password')}",
          {"password": 1})
    check("machine api.example.com login deploy password Pw0rd1",
          f"machine api.example.com login deploy password {P('password')}", {"password": 1})
    check("requirepass Pw0rd1\nbindpw Pw0rd2\nolcRootPW: {SSHA}abcdefghijklmnop1234",
          f"requirepass {P('password')}\nbindpw {P('password')}\nolcRootPW: {P('password')}",
          {"password": 3})
    for text in ("fe80:0:0:0:1", "12:30:45:10:5"):
        assert redact(text).text == text


def test_llamad_token_file() -> None:
    """llamad's own token file lines (role, then a token of 16+ characters) lose the token;
    comments, prose and <token> placeholders stay."""
    hex_token, b64_token = body(HEX, 32), body(ALNUM + "-_", 43)
    check(f"# NOC\nread   {hex_token}\nadmin {b64_token}\n",
          f"# NOC\nread   {P('llamad_token')}\nadmin {P('llamad_token')}\n",
          {"llamad_token": 2})
    for text in ("read the documentation before the upgrade", "admin <token>",
                 "read /etc/llamad/tokens-production"):
        assert redact(text).text == text


def test_multilingual_and_psk_keys() -> None:
    """Keys named password in German, Spanish, Portuguese, Dutch and French, and psk keys,
    are credentials."""
    check("Passwort=Geheim9\ndb_contrase\u00f1a: Clave9\nDB_SENHA=Senha9\nwachtwoord: W9x\n"
          "mot_de_passe: Azerty9\nwpa_psk=Psk9xyz",
          f"Passwort={P('password')}\ndb_contrase\u00f1a: {P('password')}\n"
          f"DB_SENHA={P('password')}\nwachtwoord: {P('password')}\n"
          f"mot_de_passe: {P('password')}\nwpa_psk={P('secret')}", {"password": 5, "secret": 1})


def test_github_actions_expression_is_a_reference() -> None:
    """${{ secrets.X }} names a secret held elsewhere: it stays."""
    text = "AWS_SECRET_ACCESS_KEY: ${{ secrets.AWS_SECRET }}"
    assert redact(text).text == text


# --- the bare AWS secret access key --------------------------------------------------------


def test_bare_aws_secret_access_key() -> None:
    """Forty random base64 characters with no key name are an AWS secret access key."""
    secret = body(ALNUM + "/+", 40)
    check(f"creds.csv: ops-bot,{secret}", f"creds.csv: ops-bot,{P('aws_secret')}",
          {"aws_secret": 1})


def test_forty_character_lookalikes_survive() -> None:
    """A 40-hex git SHA, base64 of text, an ssh key prefix, the last line of a wrapped
    base64 blob and a 40-character identifier are no AWS secrets."""
    wrapped = body(ALNUM + "+/", 64) + "\n" + body(ALNUM + "+/", 40)
    for text in ("commit " + body(HEX, 40), "VGhlIHF1aWNrIGJyb3duIGZveCBqdW1wcyBvdmVy",
                 "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7vbqajDhA ops@bastion",
                 f"-----BEGIN CERTIFICATE-----\n{wrapped}\n-----END CERTIFICATE-----",
                 "getUserAccountSettingsForTenant2FAEnable"):
        assert redact(text).text == text


# --- disguised keywords --------------------------------------------------------------------


@pytest.mark.parametrize("key", [
    "\u0440\u0430ssword",                                            # Cyrillic er, a
    "pass\u200bword",                                                # zero-width space
    "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44",              # full-width
    "p\u03b1ssw\u03bfrd",                                            # Greek alpha, omicron
    "pass\u00adword",                                                # soft hyphen
    "pass\u2060word",                                                # word joiner
    "PASS\u200dWORD",                                                # zero-width joiner
])
def test_disguised_password_keyword(key: str) -> None:
    """``password=`` spelt with look-alike letters or invisible characters is still a
    password assignment, and the key keeps its original characters."""
    check(f"{key}=Hunter2x", f"{key}={P('password')}", {"password": 1})
    check(f"{key}\uff1dHunter2x", f"{key}\uff1d{P('password')}", {"password": 1})


def test_disguised_value_is_removed_whole() -> None:
    """A value with zero-width characters inside is removed whole, not in part."""
    check("login password=hun\u200bter\u200b2 ok", f"login password={P('password')} ok",
          {"password": 1})


# --- linear time on hostile input ----------------------------------------------------------

MB = 1_000_000


def fill(size: int, unit: str) -> str:
    return (unit * (size // len(unit) + 1))[:size]


HOSTILE: dict[str, Callable[[int], str]] = {
    "stripe-prefixes": lambda n: fill(n, "sk" + "_live_"),
    "xml-open-tags": lambda n: fill(n, "<password>"),
    "xml-unclosed": lambda n: fill(n, "<password>a</passw"),
    "curl-users": lambda n: fill(n, "curl -u a:"),
    "mysql-flags": lambda n: fill(n, "mysql -p"),
    "base64-run": lambda n: fill(n, body(ALNUM + "/+", 40)),
    "base64-words": lambda n: fill(n, body(ALNUM + "/+", 40) + " "),
    "shadow-prefix": lambda n: fill(n, "root:$6$"),
    "crypt-prefix": lambda n: fill(n, "$6$aaaaaaaa"),
    "dollars": lambda n: fill(n, "$"),
    "putty-headers": lambda n: fill(n, "PuTTY-User-Key-File-2: x\n"),
    "begin-no-dashes": lambda n: fill(n, "BEGIN PRIVATE KEY"),
    "dashes": lambda n: fill(n, "-"),
    "em-dashes": lambda n: fill(n, "\u2014BEGIN RSA PRIVATE KEY\u2014\n"),
    "zero-width-keywords": lambda n: fill(n, "pass\u200bword="),
    "cyrillic-keywords": lambda n: fill(n, "\u0440\u0430ssword="),
    "full-width-keywords": lambda n: fill(
        n, "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44\uff1d"),
    "snmp-users": lambda n: fill(n, "snmp-server user a b v3 auth sha "),
    "snmp-priv": lambda n: fill(n, "priv aes 128 "),
    "telegram-ids": lambda n: fill(n, "123456789:AA"),
    "azure-keys": lambda n: fill(n, "AccountKey="),
    "signatures": lambda n: fill(n, "sig="),
    "client-secret-marks": lambda n: fill(n, "Q~"),
    "mailchimp-suffixes": lambda n: fill(n, "-us"),
    "pgpass-fields": lambda n: fill(n, "a:1:b:c:"),
    "token-file-roles": lambda n: fill(n, "read "),
    "continued-lines": lambda n: fill(n, "curl \\\n"),
    "netrc": lambda n: fill(n, "machine a login b password "),
    "discord-dots": lambda n: fill(n, "M" + "a" * 23 + "."),
    "twilio-prefixes": lambda n: fill(n, "SK"),
    "sql": lambda n: fill(n, "IDENTIFIED BY "),
    "quoted-keyword": lambda n: fill(n, "password '"),
    "php-define": lambda n: fill(n, "define('"),
    "named-values": lambda n: fill(n, 'name="password" value="'),
    "docker-auth": lambda n: fill(n, '"auth": "'),
    "kubeconfig": lambda n: fill(n, "client-key-data: "),
    "saas-prefixes": lambda n: fill(n, "npm_hf_key-dapi"),
    "angle-brackets": lambda n: fill(n, "<"),
    "one-long-line": lambda n: fill(n, "x"),
    "many-short-lines": lambda n: fill(n, "x\n"),
    "placeholders": lambda n: fill(n, "-u [REDACTED:x]:"),
    "uppercase-token-body": lambda n: "sk" + "_live_" + "A" * n + "b",
    "uppercase-pypi-body": lambda n: "py" + "pi-AgEIcHlwaS5vcmc" + "A" * n + "b",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_new_rules_take_linear_time_on_hostile_megabytes(name: str) -> None:
    """Input built against the new rules is redacted in linear time: 8x the text (125 kB
    to 1 MB; some are 100 000 real matches, each replaced and then read again by the second
    pass), about 8x the CPU; and the result is idempotent."""
    make = HOSTILE[name]
    assert_linear(make, lambda text: redact(text, hostnames=True, ips=True), MB // 8)
    if name in ("zero-width-keywords", "dollars", "base64-run"):
        once = redact(make(MB), hostnames=True, ips=True)
        assert redact(once.text, hostnames=True, ips=True).text == once.text
