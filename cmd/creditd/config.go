package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/lua"
)

// config is creditd's environment (docs/spec/addendum.md §11 plus our own CREDITD_*
// knobs). Every field is typed and parsed strictly: a value that does not
// parse, or a duration or count that is not positive, is an error naming
// the variable, never a silent default. README's configuration table is
// checked against these tags (TestREADMEConfigTable): change both together.
//
// Tags: env and envDefault are caarlos0/env's; mask says how the logged
// configuration hides the value ("secret": only whether it is set, "url":
// passwords in URLs).
type config struct {
	RedisURL       string        `env:"REDIS_URL" envDefault:"redis://127.0.0.1:6379/0" mask:"url"`
	DatabaseURL    string        `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" mask:"url"`
	Addr           string        `env:"CREDITD_ADDR" envDefault:":8080"`
	AdminToken     string        `env:"CREDITD_ADMIN_TOKEN" mask:"secret"`
	LogLevel       logLevel      `env:"LOG_LEVEL" envDefault:"info"`
	RedisPrefix    string        `env:"CREDITD_REDIS_PREFIX" envDefault:"cd"`
	MaxLag         time.Duration `env:"CREDITD_MAX_PERSISTER_LAG" envDefault:"5s"`
	SweepInterval  time.Duration `env:"CREDITD_SWEEP_INTERVAL" envDefault:"1s"`
	BodyLimitBytes int           `env:"CREDITD_BODY_LIMIT_BYTES" envDefault:"1048576"`
	// Consumer is the persister's consumer name; unset is the hostname.
	Consumer         string        `env:"CREDITD_INSTANCE"`
	RedisPoolSize    int           `env:"CREDITD_REDIS_POOL_SIZE" envDefault:"64"`
	AllowPrivate     bool          `env:"CREDITD_WEBHOOK_ALLOW_PRIVATE" envDefault:"false"`
	Dev              bool          `env:"CREDITD_DEV" envDefault:"false"`
	DevFile          string        `env:"CREDITD_DEV_FILE" envDefault:".data/dev-tenant.json"`
	ReservationSweep time.Duration `env:"CREDITD_RESERVATION_SWEEP_INTERVAL" envDefault:"1m"`
	Scheduler        time.Duration `env:"CREDITD_SCHEDULER_INTERVAL" envDefault:"1s"`
	WebhookWorkers   int           `env:"CREDITD_WEBHOOK_WORKERS" envDefault:"8"`
	WebhookPoll      time.Duration `env:"CREDITD_WEBHOOK_POLL" envDefault:"200ms"`
	MaxConnsPerIP    int           `env:"CREDITD_MAX_CONNS_PER_IP" envDefault:"1024"`
	PprofAddr        string        `env:"CREDITD_PPROF_ADDR"`
	// MetricsAddr, when set, serves /metrics on its own listener instead
	// of the API port (docs/spec/addendum.md §12).
	MetricsAddr string `env:"CREDITD_METRICS_ADDR"`
	// ReplicaAcks is how many replicas a money operation waits for
	// (lua.ReplicaAcksAuto: one when the slot's master has replicas).
	ReplicaAcks replicaAcks `env:"CREDITD_REPLICA_ACKS" envDefault:"auto"`
	// ReplicaAckTimeout bounds that wait (lua.DefaultReplicaAckTimeout;
	// WAIT counts whole milliseconds and the lua store rounds up).
	ReplicaAckTimeout time.Duration `env:"CREDITD_REPLICA_ACK_TIMEOUT" envDefault:"50ms"`
	// URL is the creditd the operator commands and healthcheck talk to.
	URL string `env:"CREDITD_URL" mask:"url"`
	// ReconcileSample is how many random customers the reconcile sampler
	// compares each ReconcileSampleInterval (0: off).
	ReconcileSample         reconcileSample `env:"CREDITD_RECONCILE_SAMPLE" envDefault:"20"`
	ReconcileSampleInterval time.Duration   `env:"CREDITD_RECONCILE_SAMPLE_INTERVAL" envDefault:"1m"`
	// FullRecords makes the persister write the records of the release
	// before migration 023 (app.Config.FullRecords): only for the length
	// of a rolling upgrade from it (docs/operations.md).
	FullRecords bool `env:"CREDITD_FULL_RECORDS" envDefault:"false"`
}

// minAdminTokenChars is the shortest operator token serve accepts: the token
// opens every tenant, so it must be out of reach of guessing (32 characters
// of any reasonable alphabet are over 128 bits).
const minAdminTokenChars = 32

// loadConfig reads the environment strictly; the error names every
// variable that is wrong and why.
func loadConfig() (config, error) {
	var c config
	if err := env.Parse(&c); err != nil {
		return c, configError(err)
	}
	if c.Consumer == "" {
		c.Consumer, _ = os.Hostname()
	}
	if err := c.validate(); err != nil {
		return c, err
	}
	return c, nil
}

// configFields lists config's fields with their variable names, in order.
func configFields() []reflect.StructField {
	t := reflect.TypeFor[config]()
	out := make([]reflect.StructField, 0, t.NumField())
	for i := range t.NumField() {
		if f := t.Field(i); f.Tag.Get("env") != "" {
			out = append(out, f)
		}
	}
	return out
}

// varOf is the environment variable of config field name.
func varOf(name string) string {
	f, _ := reflect.TypeFor[config]().FieldByName(name)
	return f.Tag.Get("env")
}

// configError rewrites caarlos0/env's errors, which name Go fields, into
// ones naming the variable, its value and what it should look like.
func configError(err error) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return fmt.Errorf("configuration: %w", err)
	}
	var msgs []string
	for _, e := range agg.Errors {
		var pe env.ParseError
		if !errors.As(e, &pe) {
			msgs = append(msgs, e.Error())
			continue
		}
		name := varOf(pe.Name)
		// The custom types (logLevel, replicaAcks) say what they want
		// in their own error.
		want := ""
		switch pe.Type {
		case reflect.TypeFor[time.Duration]():
			want = "a duration with a unit, such as 500ms, 5s or 1m"
		case reflect.TypeFor[bool]():
			want = "true or false (1 and 0 also work)"
		case reflect.TypeFor[int]():
			want = "a whole number"
		}
		cause := pe.Err.Error()
		var ne *strconv.NumError
		if errors.As(pe.Err, &ne) {
			cause = ne.Err.Error()
		}
		msg := fmt.Sprintf("%s=%q: %s", name, os.Getenv(name), cause)
		if want != "" {
			msg += "; want " + want
		}
		msgs = append(msgs, msg)
	}
	return fmt.Errorf("configuration: %s", strings.Join(msgs, "; "))
}

// validate refuses durations and counts that are not positive: every one of
// them is an interval, a size or a pool, where 0 or less means nothing
// sensible (the old parser quietly took the default instead).
func (c config) validate() error {
	v := reflect.ValueOf(c)
	var msgs []string
	for _, f := range configFields() {
		fv := v.FieldByIndex(f.Index)
		switch {
		case f.Type == reflect.TypeFor[time.Duration]() && fv.Int() <= 0:
			msgs = append(msgs, fmt.Sprintf("%s=%q: must be a positive duration", f.Tag.Get("env"), os.Getenv(f.Tag.Get("env"))))
		case f.Type == reflect.TypeFor[int]() && fv.Int() <= 0:
			msgs = append(msgs, fmt.Sprintf("%s=%q: must be a positive whole number", f.Tag.Get("env"), os.Getenv(f.Tag.Get("env"))))
		}
	}
	if len(msgs) > 0 {
		return fmt.Errorf("configuration: %s", strings.Join(msgs, "; "))
	}
	return nil
}

// check refuses a configuration serve must not start with (on top of what
// loadConfig refuses for every command).
func (c config) check() error {
	if c.AdminToken != "" && len(c.AdminToken) < minAdminTokenChars {
		return fmt.Errorf("CREDITD_ADMIN_TOKEN is %d characters; it must be at least %d (for example: openssl rand -hex 32), or unset to turn the admin API off", len(c.AdminToken), minAdminTokenChars)
	}
	return nil
}

// appReplicaAcks is ReplicaAcks as app.Config spells it (its zero is auto).
func (c config) appReplicaAcks() int {
	if c.ReplicaAcks == 0 {
		return app.ReplicaAcksOff
	}
	return int(c.ReplicaAcks)
}

// setting is one variable of the effective configuration, masked.
type setting struct {
	Name, Value string
}

// effective is the configuration as creditd logs it at start: every
// variable in declaration order, secrets masked.
func (c config) effective() []setting {
	v := reflect.ValueOf(c)
	out := make([]setting, 0, v.NumField())
	for _, f := range configFields() {
		val := fmt.Sprint(v.FieldByIndex(f.Index).Interface())
		switch f.Tag.Get("mask") {
		case "secret":
			if val == "" {
				val = "unset"
			} else {
				val = fmt.Sprintf("set (%d characters)", len(val))
			}
		case "url":
			val = redactURLs(val)
		}
		out = append(out, setting{Name: f.Tag.Get("env"), Value: val})
	}
	return out
}

// logDict is effective as a zerolog dictionary.
func (c config) logDict() *zerolog.Event {
	d := zerolog.Dict()
	for _, s := range c.effective() {
		d = d.Str(s.Name, s.Value)
	}
	return d
}

// dsnPassword matches a password in a key=value connection string.
var dsnPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('[^']*'|\S+)`)

// redactURLs hides the passwords of a URL, of each URL of a comma list
// (Redis Cluster seeds), or of a key=value Postgres connection string.
func redactURLs(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if u, err := url.Parse(p); err == nil && u.Scheme != "" && u.Host != "" {
			if q := u.Query(); q.Has("password") {
				q.Set("password", "xxxxx")
				u.RawQuery = q.Encode()
			}
			p = u.Redacted()
		} else {
			p = dsnPassword.ReplaceAllString(p, "${1}xxxxx")
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}

// logLevel is a zerolog level name (LOG_LEVEL).
type logLevel string

// UnmarshalText refuses a level zerolog does not know.
func (l *logLevel) UnmarshalText(b []byte) error {
	lvl, err := zerolog.ParseLevel(string(b))
	if err != nil || lvl == zerolog.NoLevel {
		return fmt.Errorf("unknown level %q; want trace, debug, info, warn, error, fatal, panic or disabled", string(b))
	}
	*l = logLevel(b)
	return nil
}

// replicaAcks is CREDITD_REPLICA_ACKS: "auto" (lua.ReplicaAcksAuto), 0
// (off) or a replica count.
type replicaAcks int

// UnmarshalText reads auto or a count >= 0.
func (r *replicaAcks) UnmarshalText(b []byte) error {
	v := strings.TrimSpace(string(b))
	if v == "auto" {
		*r = lua.ReplicaAcksAuto
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return fmt.Errorf("%q is not auto, 0 (off) or a replica count", v)
	}
	*r = replicaAcks(n)
	return nil
}

// String prints auto for lua.ReplicaAcksAuto.
func (r replicaAcks) String() string {
	if r == lua.ReplicaAcksAuto {
		return "auto"
	}
	return strconv.Itoa(int(r))
}

// reconcileSample is CREDITD_RECONCILE_SAMPLE: customers per sample, 0
// (off) up to engine.MaxReconcileSample.
type reconcileSample int

// UnmarshalText reads a count in [0, engine.MaxReconcileSample].
func (r *reconcileSample) UnmarshalText(b []byte) error {
	v := strings.TrimSpace(string(b))
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > engine.MaxReconcileSample {
		return fmt.Errorf("%q is not 0 (off) or a customer count up to %d", v, engine.MaxReconcileSample)
	}
	*r = reconcileSample(n)
	return nil
}
