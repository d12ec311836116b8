"""Redaction of the shapes a hostile tester found leaking (issue 25, item 7): database and
directory clients' password options, other shells' setters, connection strings of other
databases, URLs whose user is a key id, Unicode tag characters inside a keyword; and the
placeholders and code that must stay as they are. One test per class: the exact output
for the secrets, the text unchanged for the look-alikes.

Every secret here is fake and assembled at run time, so no literal in this file looks like
a live credential to a secret scanner.
"""

from __future__ import annotations

import functools
import random

import pytest

from retrieval.redaction._normalize import fold, normalize
from retrieval.redaction._redactor import redact
from tests.support.redaction import ALNUM, P, check, fake_body

body = functools.partial(fake_body, random.Random(20261206))
PW = "Summit" + "2931!"


def unchanged(*texts: str) -> None:
    for text in texts:
        assert redact(text).text == text, text


def in_place(kind: str, secret: str, *templates: str) -> None:
    """Each template with ``secret`` at its ``{}`` is redacted to the template with the
    placeholder of ``kind`` there: one secret found, nothing else changed."""
    for template in templates:
        check(template.format(secret), template.format(P(kind)), {kind: 1})


def test_database_client_options() -> None:
    """mysql, psql's environment, mongosh/mongodump -p, redis-cli -a/--pass, sqlcmd/bcp -P,
    mysqladmin password and influx -password lose the password."""
    pw = P("password")
    in_place("password", PW,
             'mysql --user=app --password="{}" app', "mongodump -u backup -p {} --out /b",
             "mongosh -u ops -p '{}' --host db", "redis-cli --user default --pass {}",
             'sqlcmd -S db -U sa -P {} -Q "SELECT 1"', "bcp dbo.t out t.dat -S db -U l -P{} -c",
             "mysqladmin -u root password {}", "influx -username admin -password {} -ssl")
    # The quotes glued to mysql's -p and after redis-cli's -a go with the password.
    check(f"mysql -h db01 -u app -p'{PW}' app", f"mysql -h db01 -u app -p{pw} app",
          {"password": 1})
    check(f"redis-cli -h c -a '{PW}' info", f"redis-cli -h c -a {pw} info", {"password": 1})


def test_directory_client_options() -> None:
    """ldapsearch/ldapmodify -w (also on a continued line) and ldappasswd -a/-s lose the
    password; -W (a prompt), -y FILE, -s SCOPE and -a DEREF of a search stay."""
    pw = P("password")
    in_place("password", PW, "ldapsearch -x -D cn=svc,dc=corp -w {} -b dc=corp",
             "ldapadd -x \\\n  -D cn=admin -w '{}' -f a.ldif")
    check(f"ldappasswd -x -D cn=admin -w {PW} -a Old{PW} -s New{PW} uid=bob",
          f"ldappasswd -x -D cn=admin -w {pw} -a {pw} -s {pw} uid=bob", {"password": 3})
    unchanged("ldapsearch -x -W -D cn=admin,dc=ex -b dc=ex",
              "ldapsearch -x -y /etc/ldap.pw -D cn=admin,dc=ex",
              "ldapsearch -x -s one -a always -b dc=ex")


def test_environment_variables_named_for_passwords() -> None:
    """PGPASSWORD, MYSQL_PWD, SSHPASS, REDISCLI_AUTH, *_PASS, *_PWD, *_PW and glued
    *PASSWORD names are secrets; a Kubernetes env entry (name, then value) too."""
    in_place("password", PW, *(f"{name}={{}}" for name in (
        "PGPASSWORD", "MYSQL_PWD", "SSHPASS", "REDISCLI_AUTH", "SMTP_PASS", "LDAP_BIND_PWD",
        "DB_PW", "ROOTPASSWORD", "MSSQL_SA_PASSWORD")))
    in_place("password", PW, "PGPASSWORD='{}' pg_dump -h db app",
             '  - name: PGPASSWORD\n    value: "{}"', '{{"name": "DB_PASSWORD", "value": "{}"}}')
    unchanged("PGPASSFILE=~/.pgpass psql -h db01", "bypass=1", "PASS: test_login",
              "- name: LOG_LEVEL\n  value: debug", "PGPASSWORD=$PGPASSWORD psql -h db",
              "SSHPASS=${SSHPASS} sshpass -e ssh ops@bastion")


def test_other_shells_setters() -> None:
    """fish set -x/-gx/-Ux/--export, csh setenv, launchctl setenv, cmd setx, PowerShell
    $env:, SetEnvironmentVariable, Set-Item env: and ConvertTo-SecureString -AsPlainText."""
    in_place("secret", body(ALNUM, 24),
             "set -x API_TOKEN {}", "set -gx DEPLOY_TOKEN {}", "set --export SLACK_TOKEN {}",
             "setenv SECRET_KEY {}", "launchctl setenv GH_TOKEN {}", '$env:API_TOKEN = "{}"',
             'Set-Item -Path env:API_TOKEN -Value "{}"')
    in_place("password", PW, "set -Ux DB_PASSWORD '{}'", "setx SMTP_PASSWORD {} /M",
             "[Environment]::SetEnvironmentVariable('DB_PASSWORD', '{}', 'Machine')",
             "$s = ConvertTo-SecureString '{}' -AsPlainText -Force")
    unchanged("set -gx PATH $HOME/.local/bin $PATH", "setenv EDITOR vim", "setx PATH C:\\tools",
              "set password policy to strict", "set -x API_TOKEN $API_TOKEN",
              '$env:PATH = "C:\\tools;" + $env:PATH', "setenv DB_PASSWORD changeme",
              '$pw = Read-Host -AsSecureString "Password"')


def test_connection_strings_of_other_databases() -> None:
    """JDBC, ODBC and ADO.NET passwords (to the ";", spaces and {...} included); Oracle
    user/password after its tools, CONNECT, userid= and jdbc:oracle:thin:, or before @//."""
    in_place("password", PW,
             "jdbc:sqlserver://db:1433;databaseName=app;user=sa;password={};encrypt=true",
             "jdbc:postgresql://db/app?user=app&password={}&ssl=true",
             "sqlplus scott/{}@//db01:1521/ORCLPDB1", "expdp hr/{}@pdb1 directory=DP",
             "CONNECT app_owner/{}@devdb", "sqlldr userid=loader/{} control=l.ctl",
             "batch/{}@//10.1.2.3:1521/svc", "jdbc:oracle:thin:app/{}@//h:1521/s")
    in_place("password", "two words 9", "Server=db;Database=app;User Id=sa;Password={};")
    in_place("password", "{a;b c9}", "DSN=dw;UID=etl;PWD={};")
    unchanged("sqlplus / as sysdba", "sqlplus /nolog @setup.sql", "rman target /",
              "uses: actions/checkout@v4", "npm install @scope/pkg@1.2.3",
              "Server=db01;Database=app;Integrated Security=SSPI;",
              "Password=$(DB_PASSWORD);Server=db01", "connect to host/port 22",
              "cd /opt/oracle/product/19c/dbhome_1/bin && ./sqlplus -v")


def test_urls_with_passwords_and_key_ids() -> None:
    """Mongo, Redis, AMQP URLs lose the password (an unencoded "/", "?" or "#" in it
    included); when the user is a recognised key id the whole user part goes."""
    c = P("connection_string")
    in_place("connection_string", PW, *(
        f"{scheme}://svc:{{}}@h1.example.net:1/x"
        for scheme in ("mongodb+srv", "redis", "rediss", "amqp", "amqps", "mysql", "mssql",
                       "nats")))
    check(f"mongodb://app:ab/cd#{PW}@db01:27017/app", f"mongodb://app:{c}@db01:27017/app",
          {"connection_string": 1})
    key, secret = "AK" + "IA" + body("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16), body(ALNUM + "/+", 40)
    for template in ("https://{}@s3.example.com/b/k", "s3://{}@backups/db.tar.gz"):
        got = redact(template.format(f"{key}:{secret}"))
        assert got.text == template.format(c)
        assert key not in got.text and secret not in got.text
    unchanged("https://medium.com/@author/post", "http://[2001:db8::1]:8080/status@x",
              "https://host.example:8443/@admin", "postgres://user@host/db",
              "postgres://user:$PGPASS@host/db", "https://user:@host/")


@pytest.mark.parametrize("tag", [0xE0001, 0xE0020, 0xE0041, 0xE005F, 0xE007F, 0xE0100])
def test_tag_characters_inside_a_keyword_are_read_through(tag: int) -> None:
    """Unicode tag characters (U+E0000..U+E007F) and variation selectors inside a keyword
    are dropped by the normalisation: the value goes, the tag character stays in the
    text (outside the secret, the caller's characters are kept)."""
    assert fold(chr(tag)) == ""
    text = f"pass{chr(tag)}word={PW}"
    assert normalize(text).text == f"password={PW}"
    check(text, f"pass{chr(tag)}word={P('password')}", {"password": 1})
    check(f"export GITHUB_TO{chr(tag)}KEN={PW}", f"export GITHUB_TO{chr(tag)}KEN={P('secret')}",
          {"secret": 1})


def test_placeholders_and_code_are_left_alone() -> None:
    """Template fillers, shell defaults, Terraform and code references, regular
    expressions, nulls and prompts are not secrets: the text comes out unchanged. A
    default that is a value is one."""
    unchanged(
        "DB_PASSWORD=${DB_PASSWORD:-}", "export API_TOKEN=${API_TOKEN:?unset}",
        "password: xxxxxxxxxxxxxxxx", 'api_key = "XXXX-XXXX-XXXX-XXXX"',
        "token: YOUR_GITHUB_TOKEN_HERE", "OPENAI_API_KEY=your-openai-api-key",
        "password: <password>", "password: changeme", 'secret_key = "REPLACE_ME"',
        "client_secret: enter-client-secret-here",
        "password = var.db_password", 'db_password = data.vault_generic_secret.db.data["pw"]',
        'password = os.environ["DB_PASSWORD"]', 'token = os.getenv("GITHUB_TOKEN", "")',
        "password=getpass.getpass()", "password = getpass()", "api_key = settings.OPENAI_KEY",
        "const token = process.env.API_TOKEN;", 'PASSWORD_RE = re.compile(r"password=(\\S+)")',
        "m = re.search(r'token: ([^&\\s]+)', line)", '"password": null', "password = None",
        "password: !vault |", "self.password = password", "password=self.password",
    )
    check(f"password=${{DB_PASSWORD:-{PW}}}", f"password=${{DB_PASSWORD:-{P('password')}}}",
          {"password": 1})
    check('password = "getpass()"', f'password = "{P("password")}"', {"password": 1})
    check(f"password: changeme{PW}", f"password: {P('password')}", {"password": 1})
