"""Redaction of the shapes added for issue 18 (part 2), tokens and keys: provider tokens
anywhere (and identifiers sharing their prefixes survive), cloud connection strings and
service accounts (Azure, GCP, kubeconfig, Docker), private keys and password hashes (PuTTY,
PEM blocks with odd dashes or truncated, shadow, htpasswd, crypt), and the bare AWS secret
access key (forty-character lookalikes survive); one test per shape, each with the exact
output.

Every secret here is fake and assembled at run time (prefix + generated body), so no
literal in this file looks like a live credential to a secret scanner.
"""

from __future__ import annotations

import base64
import functools
import random
import string

import pytest

from retrieval.redaction._redactor import redact
from tests.support.redaction import ALNUM, HEX, P, check, fake_body

_rng = random.Random(20261201)
body = functools.partial(fake_body, _rng)


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
