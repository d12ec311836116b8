"""Writes the labelled redaction corpus: secrets.jsonl and lookalikes.jsonl (this folder).

    .venv/bin/python -m tests.data.redaction.make_corpus

Every value is FAKE: drawn from a seeded generator in the provider's shape (prefix,
alphabet, length), never a real credential. ``secrets.jsonl``: one ``{"kind", "text",
"secret"}`` per line, ``secret`` the exact substring of ``text`` that must not survive
redaction; a row with ``"promised": false`` is a shape the README does not promise to
catch (prose, another script, a split key), measured by the benchmark but not required.
``lookalikes.jsonl``: one ``{"kind", "text"}`` per line, text that must come out
unchanged. The files are checked in; run this again only to change the corpus
(tests/unit/test_redact_corpus.py reads them, bench/bench_redact.py measures on them).
"""

from __future__ import annotations

import base64
import hashlib
import json
import string
import uuid

from tests.data.redaction.corpus_issue25 import build_issue25_lookalikes, build_issue25_secrets
from tests.data.redaction.corpus_kit import (
    ALNUM,
    B64,
    B64URL,
    HERE,
    LOOKALIKES,
    SECRETS,
    UNPROMISED,
    UPPER_ALNUM,
    add,
    b64_of,
    b64url,
    b64url_of,
    body,
    hexs,
    look,
    many,
    password,
    pem,
    rng,
    salt,
)


def build_secrets() -> None:
    # Provider tokens.
    many("aws_key", ["aws_access_key_id = {s}", "using key {s} from ci",
                     '"AccessKeyId": "{s}",'],
         lambda: rng.choice(["AK" + "IA", "AS" + "IA"]) + body(UPPER_ALNUM, 16))
    many("aws_secret", ["aws_secret_access_key = {s}", "export AWS_SECRET_ACCESS_KEY={s}",
                        '"SecretAccessKey": "{s}"'], lambda: body(B64, 40))
    many("aws_secret_bare", ["{s}", "keys: AKIA-redacted, {s} (rotate monthly)",
                             "creds.csv row 2: ops-bot,{s}", "paste this: {s}"],
         lambda: body(B64, 40))
    many("github", ["GITHUB_TOKEN={s}", "git clone https://{s}@github.com/org/repo.git",
                    "token {s}"],
         lambda: "gh" + rng.choice("pousr") + "_" + body(ALNUM, 36))
    many("github_pat", ["GH_PAT: {s}", "use {s} for the release job"],
         lambda: "github" + "_pat_" + body(ALNUM, 22) + "_" + body(ALNUM, 59))
    many("gitlab", ["PRIVATE-TOKEN: {s}", "export GITLAB_TOKEN={s}",
                    "git push https://oauth2:{s}@gitlab.example.com/g/p.git", "token was {s}"],
         lambda: "gl" + rng.choice(["pat", "dt", "rt", "ptt"]) + "-" + body(ALNUM + "_-", 20))
    many("stripe", ["STRIPE_SECRET_KEY={s}", "stripe.api_key = '{s}'", "key {s} (test mode)",
                    "curl https://api.stripe.com/v1/charges -u {s}:"],
         lambda: rng.choice(["sk", "rk"]) + "_" + rng.choice(["live", "test"]) + "_"
         + body(ALNUM, 24))
    many("stripe_webhook", ["STRIPE_WEBHOOK_SECRET={s}", "signing secret {s}"],
         lambda: "wh" + "sec_" + body(ALNUM, 32))
    many("npm", ["//registry.npmjs.org/:_authToken={s}", "NPM_TOKEN={s}", "npm token {s}"],
         lambda: "npm" + "_" + body(ALNUM, 36))
    many("sendgrid", ["SENDGRID_API_KEY={s}", "sg key {s}", "apiKey: '{s}'"],
         lambda: "SG" + "." + body(B64URL, 22) + "." + body(B64URL, 43))
    many("twilio_key", ["TWILIO_API_KEY={s}", "api key sid {s}"],
         lambda: "SK" + hexs(32))
    many("twilio_sid", ["TWILIO_ACCOUNT_SID={s}", "account_sid = '{s}'"],
         lambda: "AC" + hexs(32))
    many("twilio_token", ["TWILIO_AUTH_TOKEN={s}", "twilio.authToken: {s}"], lambda: hexs(32))
    many("gcp_key", ["https://maps.googleapis.com/maps/api/js?key={s}", "GOOGLE_API_KEY={s}",
                     "apiKey: \"{s}\""], lambda: "AI" + "za" + body(B64URL, 35))
    many("gcp_oauth", ["client_secret_web.json: GOCSPX secret is {s}", "ya29 token {s}"],
         lambda: rng.choice(["GOCSPX-" + body(B64URL, 28), "ya29." + body(B64URL, 60)]))
    many("gcp_private_key_id", ['  "private_key_id": "{s}",'], lambda: hexs(40))
    add("gcp_service_account",
        '{"type": "service_account", "private_key": "{s}\\n", "client_email": "x@y"}',
        pem("PRIVATE KEY", 4, escaped=True))
    many("slack", ["SLACK_BOT_TOKEN: {s}", "xapp token {s}"],
         lambda: "xo" + "xb-" + body(string.digits, 12) + "-" + body(string.digits, 13) + "-"
         + body(ALNUM, 24))
    many("slack_webhook", ["POST https://hooks.slack.com/services/{s} ok",
                           "webhook_url: https://hooks.slack.com/services/{s}"],
         lambda: "T" + body(UPPER_ALNUM, 8) + "/B" + body(UPPER_ALNUM, 8) + "/"
         + body(ALNUM, 24))
    many("openai", ["OPENAI_API_KEY={s}", "client = OpenAI(api_key=\"{s}\")"],
         lambda: "s" + "k-" + rng.choice(["", "proj-"]) + body(ALNUM, 48))
    many("anthropic", ["ANTHROPIC_API_KEY={s}", "x-api-key: {s}", "key {s}"],
         lambda: "sk-" + "ant-api03-" + body(B64URL, 93) + "AA")
    many("huggingface", ["HF_TOKEN={s}", "huggingface-cli login --token {s}",
                         "use_auth_token='{s}'", "token {s} from settings"],
         lambda: "hf" + "_" + body(ALNUM, 34))
    many("shopify", ["SHOPIFY_ACCESS_TOKEN={s}", "X-Shopify-Access-Token: {s}"],
         lambda: "shp" + rng.choice(["at", "ca", "pa", "ss"]) + "_" + hexs(32))
    many("mailgun", ["MAILGUN_API_KEY={s}", "api:{s} at https://api.mailgun.net"],
         lambda: "key" + "-" + body(ALNUM, 32))
    many("datadog", ["DD_API_KEY={s}", "DD_APP_KEY={s}", "datadog_application_key: {s}"],
         lambda: hexs(rng.choice([32, 40])))
    many("discord_bot", ["DISCORD_TOKEN={s}", "bot.run('{s}')", "discord bot token {s}"],
         lambda: base64.b64encode(str(rng.randint(10**17, 10**18)).encode()).decode()
         .rstrip("=") + "." + body(B64URL, 6) + "." + body(B64URL, 38))
    many("discord_webhook", ["https://discord.com/api/webhooks/{s}"],
         lambda: str(rng.randint(10**17, 10**18)) + "/" + body(B64URL, 68))
    many("telegram", ["TELEGRAM_BOT_TOKEN={s}", "https://api.telegram.org/bot{s}/getMe",
                      "bot token {s}"],
         lambda: str(rng.randint(10**8, 10**10 - 1)) + ":AA" + body(B64URL, 33))
    many("pypi", ["password = {s}", "TWINE_PASSWORD={s}", "pypi token {s}"],
         lambda: "pypi" + "-AgEIcHlwaS5vcmc" + body(B64URL, 70))
    many("digitalocean", ["DIGITALOCEAN_TOKEN={s}", "doctl auth init -t {s}"],
         lambda: "do" + rng.choice("por") + "_v1_" + hexs(64))
    many("atlassian", ["JIRA_API_TOKEN={s}", "atlassian token {s}"],
         lambda: "ATATT3" + body(B64URL, 180) + "=" + hexs(8).upper())
    many("heroku", ["HEROKU_API_KEY={s}", "heroku_api_key: {s}"],
         lambda: str(uuid.UUID(int=rng.getrandbits(128))))
    many("heroku", ["heroku key {s}"], lambda: "HRKU-AA" + body(B64URL, 58))
    many("square", ["SQUARE_ACCESS_TOKEN={s}", "square token {s}"],
         lambda: rng.choice(["sq0" + "atp-" + body(B64URL, 22), "EAAA" + body(B64URL, 60)]))
    many("azure_client_secret", ["AZURE_CLIENT_SECRET={s}", "client secret value {s}"],
         lambda: body(ALNUM, 3) + str(rng.randint(0, 9)) + "Q~" + body(ALNUM + "_~.-", 34))
    many("azure_storage", [
        "DefaultEndpointsProtocol=https;AccountName=acct01;AccountKey={s};EndpointSuffix="
        "core.windows.net",
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;"
        "SharedAccessKey={s}"], lambda: b64_of(64))
    many("azure_sas", [
        "https://acct.blob.core.windows.net/c/b.txt?sv=2022-11-02&se=2025-01-01&sp=r&sig={s}",
        "BlobEndpoint=https://a.blob.core.windows.net/;SharedAccessSignature=sv=2022-11-02&"
        "sig={s}"],
        lambda: b64_of(32).replace("+", "%2B").replace("/", "%2F").replace("=", "%3D"))
    many("vault", ["VAULT_TOKEN={s}", "vault login {s}", "X-Vault-Token: {s}"],
         lambda: "hv" + "s." + body(B64URL, 90))
    many("vault_legacy", ["vault login {s}"], lambda: "s." + body(ALNUM, 24))
    many("sentry", ["SENTRY_AUTH_TOKEN={s}"], lambda: "sntry" + "u_" + hexs(64))
    many("grafana", ["GF_TOKEN={s}", "grafana sa token {s}"],
         lambda: "gl" + "sa_" + body(ALNUM, 32) + "_" + hexs(8))
    many("databricks", ["DATABRICKS_TOKEN={s}", "databricks token {s}"],
         lambda: "dapi" + hexs(32))
    many("age", ["# secret key: {s}"], lambda: "AGE-SECRET-KEY-1" + body(UPPER_ALNUM, 58))
    many("jwt", ["Authorization: Bearer {s}", "id_token={s}&state=abc",
                 "cookie session {s}; path=/"],
         lambda: ".".join([b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()),
                           b64url(json.dumps({"sub": body(ALNUM, 12), "iat": rng.randint(
                               1_600_000_000, 1_800_000_000)}).encode()), b64url_of(32)]))
    many("bearer", ["Authorization: Bearer {s}", "curl -H 'authorization: bearer {s}' x"],
         lambda: body(ALNUM + "-._~", 40))
    many("basic_auth", ["Authorization: Basic {s}", "Proxy-Authorization: Basic {s}"],
         lambda: base64.b64encode(f"svc:{password()}".encode()).decode())
    # Private keys.
    for label in ("RSA PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY", "PRIVATE KEY",
                  "ENCRYPTED PRIVATE KEY", "DSA PRIVATE KEY", "PGP PRIVATE KEY BLOCK"):
        add("pem", "key material:\n{s}\nend of paste", pem(label))
    for dash in ("\u2014\u2013", "\u2013\u2013\u2013\u2013\u2013", "\u2014\u2014",
                 "\u2010" * 5, "\u2212" * 5, "\uff0d" * 5, "\u2015\u2015\u2015", "\u2011" * 5,
                 "\u2012" * 5):
        add("pem_unicode_dashes", "from the wiki:\n{s}\n", pem("RSA PRIVATE KEY", 4, dash))
    add("pem_truncated", "pasted:\n{s}\n\nNext step: restart nginx.",
        "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(b64_of(48) for _ in range(4)))
    for version in ("2", "3"):
        priv = "\n".join(b64_of(48) for _ in range(2))
        add("putty", "id.ppk:\n{s}\n",
            f"PuTTY-User-Key-File-{version}: ssh-rsa\nEncryption: none\n"
            f"Comment: rsa-key-20240101\nPublic-Lines: 2\n{b64_of(48)}\n{b64_of(24)}\n"
            f"Private-Lines: 2\n{priv}\nPrivate-MAC: {hexs(64)}")
    # Password hashes.
    many("shadow", ["{s}:19000:0:99999:7:::"],
         lambda: "root:$6$" + salt() + "$" + body("./" + ALNUM, 86))
    add("shadow", "deploy:{s}:19100:0:99999:7:::", "$y$j9T$" + salt() + "$"
        + body("./" + ALNUM, 43))
    add("shadow", "{s}:19000:0:99999:7:::", "$1$" + body("./" + ALNUM, 8) + "$"
        + body("./" + ALNUM, 22))
    many("htpasswd", ["admin:{s}", "ops@example.com:{s}"],
         lambda: "$apr1$" + body("./" + ALNUM, 8) + "$" + body("./" + ALNUM, 22))
    add("htpasswd", "alice:{s}", "{SHA}" + base64.b64encode(rng.randbytes(20)).decode())
    add("htpasswd", "bob:{s}", "$2y$10$" + body("./" + ALNUM, 53))
    add("crypt_hash", "hash stored: {s}", "$argon2id$v=19$m=65536,t=3,p=4$" + b64_of(16)
        .rstrip("=") + "$" + b64_of(32).rstrip("="))
    # Command lines.
    many("curl_user", ["curl -u admin:{s} https://api.example.com/x",
                       "curl --user 'deploy:{s}' https://x", "curl -sS -u ci:{s} -X POST x",
                       "curl \\\n  -H 'Accept: application/json' \\\n  --user bot:{s} \\\n  x"],
         password)
    many("mysql", ["mysql -uroot -p{s} app", "mysqldump -u backup -p'{s}' --all-databases",
                   "mysql --password={s} -h db01"], password)
    many("sshpass", ["sshpass -p {s} ssh admin@10.0.0.5", "sshpass -p '{s}' scp a b:"],
         password)
    many("docker_login", ["docker login -u ci -p {s} registry.example.com"], password)
    many("redis_cli", ["redis-cli -h cache -a {s} ping"], password)
    many("openssl", ["openssl pkcs12 -export -in a.crt -passout pass:{s} -out a.p12"],
         password)
    many("keytool", ["keytool -importkeystore -srcstorepass {s} -deststorepass changeit2"],
         password)
    many("htpasswd_cmd", ["htpasswd -bc /etc/nginx/.htpasswd admin {s}"], password)
    many("net_user", ["net user svc_backup {s} /add"], password)
    many("smbclient", ["smbclient //fs/share -U admin%{s}"], password)
    # Device configuration.
    many("snmpv3", ["snmp-server user NMS NMSGROUP v3 auth sha {s} priv aes 128 PrivPw9x",
                    "snmp-server user NMS NMSGROUP v3 auth sha AuthPw9x priv aes 128 {s}",
                    "snmp-server user mon grp v3 auth md5 {s}"], password)
    many("net_snmp", ["createUser nms SHA \"{s}\" AES \"Priv2pw9\"",
                      "createUser nms SHA Auth9pw AES {s}",
                      "snmpwalk -v3 -u nms -l authPriv -a SHA -A {s} -x AES -X x host"],
         password)
    many("snmp_community", ["snmp-server community {s} RO", "rocommunity {s} 10.0.0.0/8",
                            "snmpwalk -v2c -c {s} 10.0.0.1"], password)
    many("cisco", ["enable secret 5 {s}", "username admin privilege 15 secret 9 {s}"],
         lambda: "$1$" + body("./" + ALNUM, 4) + "$" + body("./" + ALNUM, 22))
    many("cisco_type7", ["username ops password 7 {s}", " password 7 {s}"], lambda: hexs(12)
         .upper())
    many("juniper", ['set system root-authentication encrypted-password "{s}"',
                     'authentication-key "{s}"; ## SECRET-DATA'],
         lambda: "$9$" + body(ALNUM + "./", 20))
    many("psk", ["ikev1 pre-shared-key {s}", "crypto isakmp key {s} address 203.0.113.5",
                 "wpa_psk={s}", 'psk="{s}"'], password)
    # Files.
    many("pgpass", ["db01.example.com:5432:app:app_user:{s}", "*:*:*:replicator:{s}"],
         password)
    many("netrc", ["machine api.example.com login deploy password {s}"], password)
    many("redis_conf", ["requirepass {s}", "masterauth {s}"], password)
    many("ldap", ["rootpw {s}", "bindpw {s}", "olcRootPW: {s}"], password)
    many("llamad_token_file", ["admin {s}", "read   {s}", "  admin\t{s}"],
         lambda: rng.choice([hexs(32), base64.urlsafe_b64encode(rng.randbytes(24)).decode()]))
    many("docker_config", ['{"auths": {"https://index.docker.io/v1/": {"auth": "{s}"}}}',
                           '_auth = {s}'],
         lambda: base64.b64encode(f"ci-user:{password()}".encode()).decode())
    many("kubeconfig", ["    client-key-data: {s}"], lambda: b64_of(120))
    many("kube_token", ["    token: {s}"], lambda: b64url_of(40))
    # Key/value shapes.
    many("assignment", ["password={s}", "DB_PASSWORD={s}", "secret: {s}",
                        "client_secret = '{s}'", '{"password": "{s}"}',
                        "os.environ['DB_PASSWORD'] = '{s}'", "config[\"api_key\"] = \"{s}\""],
         password)
    many("xml", ["<password>{s}</password>", "<db>\n  <secret>{s}</secret>\n</db>",
                 "<apiKey>{s}</apiKey>", "<ns:clientSecret>{s}</ns:clientSecret>",
                 "<password><![CDATA[{s}]]></password>"], password)
    many("xml_attribute", ['<user name="admin" password="{s}"/>',
                           "<datasource pwd='{s}' url='jdbc:x'/>",
                           '<property name="password" value="{s}"/>',
                           '<add key="DbPassword" value="{s}" />'], password)
    many("php_define", ["define('DB_PASSWORD', '{s}');", "define( 'AUTH_KEY', '{s}' );"],
         password)
    many("setter", ['ds.setPassword("{s}");'], password)
    many("c_define", ['#define DB_PASSWORD "{s}"', '#define API_KEY L"{s}"'], password)
    many("multilingual_key", ["Passwort: {s}", "contrase\u00f1a = {s}", "DB_SENHA={s}"],
         password)
    many("ibm_cloud", ["IBM_CLOUD_IAM_KEY={s}", "ibm_cos_hmac_secret_access_key = '{s}'"],
         lambda: body(B64URL, 44))
    many("okta", ["Authorization: SSWS {s}"], lambda: "00" + body(B64URL, 40))
    many("sql", ["CREATE USER app IDENTIFIED BY '{s}';", "ALTER ROLE app WITH PASSWORD '{s}';",
                 "SET PASSWORD FOR 'app'@'%' = PASSWORD('{s}');",
                 "CREATE USER scott IDENTIFIED BY {s};"], password)
    many("connection_string", ["postgres://app:{s}@db01.internal:5432/app",
                               "mongodb+srv://admin:{s}@cluster0.example.net/test",
                               "Server=db;Database=app;User Id=sa;Password={s};"], password)
    many("cli_flag", ["mysql -u root --password {s} -h db", "vault write --token {s} x"],
         password)
    # Disguised keywords.
    many("unicode_keyword", ["\u0440\u0430ssword={s}", "pass\u200bword={s}",
                             "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44\uff1d{s}",
                             "p\u0430ssw\u043erd: {s}", "pass\u00adword = {s}",
                             "\u0455ecret={s}", "api\u2060_key={s}", "t\u043eken: {s}"],
         password)


def build_lookalikes() -> None:
    data = [rng.randbytes(32) for _ in range(12)]
    look("git_sha", *(f"commit {hashlib.sha1(d, usedforsecurity=False).hexdigest()}"
                      for d in data[:6]))
    look("git_sha", "fixed in 3f2a9c1 and 9b1dc7a", "Merge: a442d05 052d41e",
         f"git checkout {hashlib.sha1(b'x', usedforsecurity=False).hexdigest()} -- src/")
    look("md5", *(f"md5sum {hashlib.md5(d, usedforsecurity=False).hexdigest()}  file.iso"
                  for d in data[:4]))
    look("sha1", *(f"{hashlib.sha1(d, usedforsecurity=False).hexdigest().upper()}  b.tar"
                   for d in data[4:7]))
    look("sha256", *(f"sha256: {hashlib.sha256(d).hexdigest()}" for d in data[:5]))
    look("sha512", f"sha512 {hashlib.sha512(data[0]).hexdigest()}")
    look("docker_digest", *(f"image: nginx@sha256:{hashlib.sha256(d).hexdigest()}"
                            for d in data[5:9]))
    look("sri_hash", "integrity=\"sha384-oqVuAfXRKap7fdgcCY5uykM6+R9GqQ8K/uxy9rx7HNQlGYl1kPz"
         "Qho1wx4JwY8wC\"")
    look("uuid", *(f"request id {uuid.UUID(int=rng.getrandbits(128))}" for _ in range(5)))
    look("uuid", f"tenant_id: {uuid.UUID(int=rng.getrandbits(128))}",
         f"subscription {str(uuid.UUID(int=rng.getrandbits(128))).upper()}")
    look("cve", "CVE-2024-3094 affects xz 5.6.0 and 5.6.1", "see CVE-2021-44228 (Log4Shell)",
         "GHSA-jfh8-c2jp-5v3q fixed")
    look("version", "upgrade to v2.4.1 (build 2.4.1-rc.2+sha.5114f85)",
         "llama.cpp b4567, Python 3.11.7, OpenSSL 3.0.13 30 Jan 2024",
         "kernel 6.18.44-fc-v657", "IOS XE 17.9.4a", "Junos 22.4R3-S2.11",
         "version: 1.2.3-alpha.10+build.20240501")
    look("mac", "MAC 00:1a:2b:3c:4d:5e and 00-1A-2B-3C-4D-5E",
         "bridge fdb add 52:54:00:12:34:56 dev eth0", "Cisco mac aaaa.bbbb.cccc")
    look("date", "2024-05-01T12:30:45Z", "released 2024-05-01 12:00:01 UTC",
         "Mon, 01 Jan 2024 00:00:00 GMT", "uptime 12:30:45", "20240501T123045")
    look("base64_text", *(base64.b64encode(s.encode()).decode() for s in (
        "The quick brown fox jumps over the lazy dog.",
        "hello world, this is plain text not a key",
        "restart nginx after the config change",
        "Lorem ipsum dolor sit amet, consectetur")))
    look("base64_text", "VGhlIHF1aWNrIGJyb3duIGZveCBqdW1wcyBvdmVy")
    look("k8s_name", "pod/web-7d4b9c8f6-x2x9k Running", "deployment.apps/api-server-v2",
         "replicaset payments-5c9f7d8b4 scaled", "kubectl get secret db-creds -o yaml",
         "secretName: tls-cert-prod", "serviceAccountName: ci-runner")
    look("identifier", "AbstractSingletonProxyFactoryBean2Impl3",
         "getUserAccountSettingsForTenant2FAEnable", "HTTPServerConfigurationManagerFactory2X",
         "ThisIsAVeryLongCamelCaseIdentifierName1", "kubernetesIoServiceAccountTokenVolume1Ab",
         "def resetPasswordForUser(user_id: int) -> None:",
         "class TokenBucketRateLimiter2:", "tokenizerConfigPath = cfg.tokenizer_path",
         "sk-learn-is-not-a-key-but-a-long-slug-name", "hf_hub_download(repo_id, filename)",
         "npm_config_registry=https://registry.npmjs.org/",
         "key-value-store-configuration-for-tenants", "SGDClassifier.fit(X, y)",
         "ACCESS_KEY_ENV_NAME = 'AWS_ACCESS_KEY_ID'", "sk_test_mode_enabled = True")
    look("path", "src/main/java/org/Example/Service2/Impl3.java",
         "/usr/local/lib/python3.11/site-packages/foo", "C:\\Program Files\\App\\config.ini",
         "private_key = /etc/ssl/private/web01.key", "credentials: ~/.aws/credentials",
         "ssh -i ~/.ssh/id_ed25519 admin@host", "PWD=/home/alice")
    look("url", "https://example.com/path?x=1&y=2", "http://host:8080/api/v1/items",
         "git@github.com:org/repo.git", "https://user@example.com/only-a-user",
         "https://hooks.example.com/services/status", "https://maps.googleapis.com/maps/api/js",
         "ftp://mirror.example.org/pub/", "https://api.telegram.org/bot/getMe (docs)")
    look("prose", "Reset your password in the portal.",
         "The password policy requires 12 characters; rotate tokens every 90 days.",
         "A token bucket algorithm limits the API; the bearer of this letter is trusted.",
         "Enable password authentication in sshd_config.",
         "Username and password are required.", "The key points are listed below.",
         'Keep the secret "sauce" in the recipe; a password 6 characters long is too short.',
         "Use the --password flag to set it, or --token instead.",
         "Never share your API key or secret with anyone.",
         "read the documentation before the upgrade",
         "admin users can change the settings",
         "The snmp community string must be changed from public.",
         "Store secrets in Vault; never commit them.",
         "curl -u is how you pass credentials to curl.",
         "mysql -p prompts for the password.",
         "Passwords are hashed with argon2id; see docs/security.md.",
         "the user was identified by its hash",
         "Log in with password authentication disabled.",
         "net user accounts are managed by the domain controller")
    look("reference", "password: $DB_PASSWORD", "password=${VAULT_PASS}",
         "password: <your-password>", "password: ****", "password: '{{ vault_db_password }}'",
         "api_key = %API_KEY%", "token: null", "secret: ~", "password: str",
         "Authorization: Bearer $TOKEN", "Authorization: Bearer <token>",
         "export GITHUB_TOKEN=$(gh auth token)", "AWS_SECRET_ACCESS_KEY: ${{ secrets.AWS }}",
         "curl -u $USER:$PASS https://x", "mysql -p$MYSQL_PWD app",
         "<password>${db.password}</password>", '<property name="password" value="${pw}"/>',
         "admin <token>", "read <token>", "[REDACTED:password]",
         "def login(user: str, password: str) -> bool:",
         "password_policy=strict token_expiry=3600 sort_key=name secret_name: db-creds")
    look("config", "key chain OSPF\n key 1\n  cryptographic-algorithm hmac-sha-256",
         "snmp-server enable traps", "snmp-server user NMS NMSGROUP v3",
         "ip ssh version 2", "service password-encryption", "aaa new-model",
         "username admin privilege 15", "docker run -u 1000:1000 app",
         "chown www-data:www-data /var/www", "ps -u root", "ssh -p 2222 admin@host",
         "[mysql]\nuser = app\nhost = db01", "auth: required", "auth_method: psk",
         "key_file: server.key", "tls_key: /etc/tls/tls.key", "PASS: test_login")
    look("cert", "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----",
         "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYI\n-----END PUBLIC KEY-----",
         "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7vbqajDhA ops@bastion",
         "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx5 me@laptop",
         "SHA256:nThbg6kXUpJWGl7E1IGOCspRomTxdCARLviKw6E5SY8 (ED25519)")
    look("numbers", "port 5432, pid 12345, 1234567890:AAB docs", "IBAN DE89 3704 0044 0532 0130 00",
         "phone +1-202-555-0143", "order #AC1234", "ticket SK-12345")
    look("ip", "10.0.0.12", "route 10.0.0.0/8 via 2001:db8::1", "fe80::1%eth0")
    look("shell", "echo $1$2$3", "awk '{print $1$2}' file", "for x in $(ls); do echo $x; done",
         "grep -c error app.log", "tar -czf backup.tgz /srv", "rsync -a --delete src/ dst/")
    look("log", "admin 2024-05-01T12:00:00Z", "INFO:root:Starting:server",
         "2024-05-01 12:00:01,234 INFO auth: login ok for admin (token expires in 3600 s)",
         "GET /api/v1/users?page=2&sort=name HTTP/1.1 200",
         "kubelet: Successfully pulled image sha256:" + hashlib.sha256(b"img").hexdigest())
    look("crypto_public", "fingerprint SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU",
         "pubkey 04" + "ab" * 32, "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p")


def main() -> None:
    build_secrets()
    build_lookalikes()
    build_issue25_secrets()
    build_issue25_lookalikes()
    with (HERE / "secrets.jsonl").open("w", encoding="utf-8") as f:
        for i, (kind, text, secret) in enumerate(SECRETS):
            row: dict[str, object] = {"kind": kind, "text": text, "secret": secret}
            if i in UNPROMISED:
                row["promised"] = False
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with (HERE / "lookalikes.jsonl").open("w", encoding="utf-8") as f:
        for kind, text in LOOKALIKES:
            f.write(json.dumps({"kind": kind, "text": text}, ensure_ascii=False) + "\n")
    print(f"{len(SECRETS)} secrets, {len(LOOKALIKES)} look-alikes written to {HERE}")


if __name__ == "__main__":
    main()
