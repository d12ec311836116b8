"""The redaction corpus's rows of issue 25 (shapes a hostile tester found leaking, written
anew), built by make_corpus.py after the rest: they draw from the generator where the rest
left it, so that the earlier rows keep their values."""

from __future__ import annotations

import base64
import hashlib

from tests.data.redaction.corpus_kit import (
    ALNUM,
    B64,
    UPPER_ALNUM,
    add,
    body,
    look,
    many,
    password,
    rng,
    tagged,
    unpromised,
    word,
)


def build_issue25_secrets() -> None:
    many("db_cli", [
        "mysql -h db01 -u app -p'{s}' app_prod", 'mysql --user=app --password="{s}" app',
        "PGPASSWORD='{s}' pg_dump -h db02 -U app app > app.sql",
        "PGPASSWORD={s} psql -h 10.0.0.5 -U postgres -c 'select 1'",
        "mongodump -u backup -p {s} --authenticationDatabase admin --out /backup",
        "mongosh --username ops --password {s} db01:27017/admin",
        "mongosh -u ops -p '{s}' --host rs0/db01,db02",
        "redis-cli -h cache01 -p 6380 -a '{s}' info replication",
        "redis-cli --user default --pass {s} -h cache02 ping",
        'sqlcmd -S tcp:db01,1433 -U sa -P {s} -Q "SELECT @@VERSION"',
        "bcp dbo.orders out orders.dat -S db03 -U loader -P{s} -c",
        "mysqladmin -u root password {s}", "influx -username admin -password {s} -ssl",
        "MYSQL_PWD={s} mysql -u root -e 'show databases'",
        "REDISCLI_AUTH={s} redis-cli -h cache03 dbsize"], password)
    many("directory_cli", [
        'ldapsearch -H ldaps://dc01.corp.example -D "cn=svc-reader,ou=svc,dc=corp" -w {s} '
        "-b dc=corp '(uid=alice)'",
        "ldapmodify -x -D cn=admin,dc=example,dc=org -w '{s}' -f users.ldif",
        "ldappasswd -x -D cn=admin,dc=example,dc=org -w Adm1nPw9 -s {s} "
        "uid=bob,ou=people,dc=example,dc=org",
        "ldapadd -x -H ldap://ldap01 \\\n  -D cn=admin,dc=ex -w {s} -f base.ldif",
        "ldapwhoami -x -D uid=svc,ou=apps,dc=ex -w {s}"], password)
    many("shell_setter", [
        "set -x API_TOKEN {s}", "set -gx DEPLOY_TOKEN {s}", "set -Ux DB_PASSWORD '{s}'",
        "set --export SLACK_TOKEN {s}", "set --global --export SMTP_PASS {s}",
        "setenv SECRET_KEY {s}", 'setenv DB_PASS "{s}"', "launchctl setenv GH_TOKEN {s}",
        "setx SMTP_PASSWORD {s} /M", '$env:API_TOKEN = "{s}"', "$Env:DB_PASSWORD='{s}'",
        "[Environment]::SetEnvironmentVariable('AZURE_CLIENT_SECRET', '{s}', 'Machine')",
        'Set-Item -Path env:REGISTRY_PASSWORD -Value "{s}"',
        "$secure = ConvertTo-SecureString '{s}' -AsPlainText -Force",
        "ConvertTo-SecureString -String \"{s}\" -AsPlainText -Force"],
         lambda: body(ALNUM, rng.choice([12, 20, 32])))
    many("env_password", [
        "PGPASSWORD={s}", "export PGPASSWORD='{s}'", "SMTP_PASS={s}", "LDAP_BIND_PWD: {s}",
        "RABBITMQ_DEFAULT_PASS={s}", '  - name: PGPASSWORD\n    value: "{s}"',
        "MSSQL_SA_PASSWORD={s}", "SSHPASS={s} sshpass -e ssh ops@bastion01",
        "ROOTPASSWORD={s}", "DB_PW={s}", "mysqlRootPassword: {s}", "ORACLE_PWD={s}",
        "environment:\n  - MONGO_INITDB_ROOT_PASSWORD={s}"], password)
    many("oracle", [
        "sqlplus scott/{s}@//db01.example.net:1521/ORCLPDB1",
        "sqlplus -s system/{s}@prod @report.sql",
        "expdp hr/{s}@pdb1 directory=DP_DIR dumpfile=hr.dmp schemas=HR",
        "rman target sys/{s}@cdb1 catalog rcat/{s}@rcatdb", "CONNECT app_owner/{s}@devdb",
        "sqlldr userid=loader/{s} control=load.ctl log=load.log",
        "batch/{s}@//10.1.2.3:1521/svc",
        "jdbc:oracle:thin:app/{s}@//dbhost:1521/service"],
         lambda: password().replace("@", "#"))  # an unquoted "@" ends it in Oracle
    many("connection_string_db", [
        "jdbc:sqlserver://db01:1433;databaseName=app;user=sa;password={s};encrypt=true",
        "jdbc:postgresql://db/app?user=app&password={s}&ssl=true",
        "Driver={ODBC Driver 18 for SQL Server};Server=tcp:db,1433;Uid=app;Pwd={s};",
        "Server=db;Database=app;User ID=app;Password={s};TrustServerCertificate=True",
        "Data Source=ORCL;User Id=hr;Password={s};",
        "Provider=SQLOLEDB;Data Source=db;Initial Catalog=app;User Id=sa;Password={s};",
        "Host=pg01;Port=5432;Username=app;Password={s};Database=app"], password)
    many("connection_string_spaces", [
        "Server=db;Database=app;User Id=sa;Password={s};",
        "Driver={PostgreSQL Unicode};Server=db;Uid=app;Pwd={s};"],
         lambda: word() + " " + word() + str(rng.randint(10, 99)))
    add("connection_string_spaces", "DSN=warehouse;UID=etl;PWD={s};",
        "{" + word() + ";" + word() + str(rng.randint(10, 99)) + "}")
    many("db_url", [
        "mongodb+srv://svc:{s}@cluster1.abcde.mongodb.net/?retryWrites=true",
        "redis://default:{s}@cache01:6379/2", "rediss://:{s}@cache.example.net:6380",
        "amqp://app:{s}@rabbit01:5672/vhost", "amqps://app:{s}@mq.example.com/prod",
        "mysql://root:{s}@127.0.0.1:3306/app", "mssql://sa:{s}@db/app",
        'psql "postgresql://app:{s}@db01.internal/app?sslmode=require"',
        "nats://ops:{s}@nats01:4222", "ldaps://cn=admin:{s}@ldap01:636"], password)
    many("db_url_unencoded", ["mongodb://app:{s}@db01:27017/app",
                              "redis://:{s}@cache01:6379"],
         lambda: body(ALNUM, 6) + rng.choice("/?#") + body(ALNUM, 6))
    for template in ("https://{k}:{s}@s3.example.com/bucket/key",
                     "s3://{k}:{s}@backups/db/2026-12-01.tar.gz",
                     "git clone https://{k}:{s}@git.example.net/ops/infra.git"):
        key = "AK" + "IA" + body(UPPER_ALNUM, 16)
        add("url_key_userinfo", template.replace("{k}", key), body(B64, 40))
    for word_, at, tag in (("password", 4, 0xE0041), ("api_key", 3, 0xE005F),
                           ("token", 2, 0xE0001), ("secret", 4, 0xE0065),
                           ("passwd", 4, 0xE0100), ("DB_PASSWORD", 3, 0xE0020)):
        add("tag_characters", tagged(word_, at, tag) + "={s}", password())
    add("tag_characters", "export GITHUB_" + tagged("TOKEN", 1, 0xE007F) + "={s}",
        password())
    # Not promised (the README says so): measured, not required.
    unpromised("prose", "the db password is {s} until Friday", password())
    unpromised("other_script", "\u043f\u0430\u0440\u043e\u043b\u044c: {s}", password())
    unpromised("split_key", "pass\nword={s}", password())
    unpromised("base64_config", "config: {s}", base64.b64encode(
        f"user=app\npassword={password()}\n".encode()).decode())


def build_issue25_lookalikes() -> None:
    look("placeholder", "DB_PASSWORD=${DB_PASSWORD:-}", "export API_TOKEN=${API_TOKEN:?unset}",
         "password: xxxxxxxxxxxxxxxx", 'api_key = "XXXX-XXXX-XXXX-XXXX"',
         "token: YOUR_GITHUB_TOKEN_HERE", "OPENAI_API_KEY=your-openai-api-key",
         "password: <password>", "password: changeme", 'secret_key = "REPLACE_ME"',
         "set -x API_TOKEN your_token_here", "setenv DB_PASSWORD changeme",
         '$env:API_TOKEN = "<your token>"', "mysql -u root -p'<password>' app",
         "client_secret: enter-client-secret-here", "PGPASSWORD=$PGPASSWORD psql -h db01",
         "SSHPASS=${SSHPASS} sshpass -e ssh ops@bastion01",
         "Password=$(DB_PASSWORD);Server=db01")
    look("code", "password = var.db_password", "master_password = var.rds_master_password",
         'db_password = data.vault_generic_secret.db.data["pw"]',
         'password = os.environ["DB_PASSWORD"]', 'token = os.getenv("GITHUB_TOKEN", "")',
         "password=getpass.getpass()", "api_key = settings.OPENAI_API_KEY",
         'secret = config.get("auth", "secret")', "const token = process.env.API_TOKEN;",
         "password: \"{{ lookup('env', 'DB_PASSWORD') }}\"",
         'PASSWORD_RE = re.compile(r"password=(\\S+)")',
         "m = re.search(r'token: ([^&\\s]+)', line)", '"password": null', "password = None",
         '$pw = Read-Host -AsSecureString "Password"', "password: !vault |",
         'String pw = System.getenv("DB_PW");', "pw := os.Getenv(\"DB_PW\")",
         "self.password = password", "password=self.password")
    look("command", "sqlplus / as sysdba", "sqlplus /nolog @setup.sql",
         "ldapsearch -x -W -D cn=admin,dc=ex -b dc=ex",
         "ldapsearch -x -y /etc/ldap.pw -D cn=admin,dc=ex", "ldapsearch -x -s one -b dc=ex",
         "mysql -u root -p app_db", "mongosh --host db01 --port 27017",
         'sqlcmd -S db01 -E -Q "SELECT @@VERSION"', "redis-cli -h cache01 -p 6379 ping",
         "set -gx PATH $HOME/.local/bin $PATH", "setenv EDITOR vim",
         '$env:PATH = "C:\\tools;" + $env:PATH', "setx PATH C:\\tools",
         "set password policy to strict", "PGPASSFILE=~/.pgpass psql -h db01",
         "openssl enc -aes-256-cbc -pass env:BACKUP_PW -in a.tar",
         "./server -password-file /etc/app/pw", "rman target /",
         "cd /opt/oracle/product/19c/dbhome_1/bin && ./sqlplus -v")
    look("url", "uses: actions/checkout@v4",
         "docker pull bitnami/redis@sha256:" + hashlib.sha256(b"redis").hexdigest(),
         "https://medium.com/@author/a-post", "http://[2001:db8::1]:8080/status@x",
         "https://host.example:8443/@admin", "npm install @scope/pkg@1.2.3",
         "Server=db01;Database=app;Integrated Security=SSPI;",
         "see the diagram at docs/arch/db@2x.png")
