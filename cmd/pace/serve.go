package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprometheus "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/fleetpace/pace"
)

const serveUsage = `usage:
  pace serve -upstream URL -limit TEXT [-listen ADDR] [-redis URL] [-in-flight N] [-max-wait D]
  pace serve -config FILE
`

// runServe runs pace serve: see serve.
func runServe(ctx context.Context, args []string, _, errOut io.Writer) error {
	return serve(ctx, args, errOut)
}

// serve runs pace serve with args until ctx ends or a SIGINT or SIGTERM
// comes, logging to logOut. A SIGHUP reloads its -config file (see
// server.reload).
func serve(ctx context.Context, args []string, logOut io.Writer) error {
	c, path, err := serveFlags(args, logOut)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(logOut, nil))
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hangups := make(chan os.Signal, 1)
	signal.Notify(hangups, syscall.SIGHUP)
	defer signal.Stop(hangups)
	s, err := newServer(ctx, c, logger)
	if err != nil {
		return err
	}
	if err := s.start(); err != nil {
		s.close()
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return s.shutdown()
		case <-hangups:
			s.reloadOnHangup(path)
		}
	}
}

// reloadOnHangup reloads the configuration at path, and logs what became
// of it: the flags' configuration, with no file, stays.
func (s *server) reloadOnHangup(path string) {
	if path == "" {
		s.logger.Warn("pace serve: SIGHUP: no -config file to reload; the flags' route serves on")
		return
	}
	if err := s.reload(path); err != nil {
		s.logger.Error("pace serve: SIGHUP: the configuration before it serves on", "err", err)
		return
	}
	s.logger.Info("pace serve: reloaded", "config", path, "routes", len(s.table.Load().routes))
}

// serveFlags reads pace serve's flags into a configuration: its -config
// file, whose path it returns too, or the one route the other flags say.
func serveFlags(args []string, errOut io.Writer) (*serveConfig, string, error) {
	flags := flag.NewFlagSet("pace serve", flag.ContinueOnError)
	flags.SetOutput(errOut)
	flags.Usage = func() {
		fmt.Fprint(errOut, serveUsage+"\nflags of pace serve:\n")
		flags.PrintDefaults()
	}
	file := flags.String("config", "", "a YAML file of routes (docs/serve.md); no other flag goes with it")
	var r routeConfig
	var c serveConfig
	flags.StringVar(&c.Listen, "listen", defaultListen, "the address to listen on")
	flags.StringVar(&c.Redis, "redis", "", "the Redis URL the replicas share (redis://HOST:PORT/DB); without it, an embedded store paces this replica alone")
	flags.StringVar(&r.Upstream, "upstream", "", "the upstream's URL")
	flags.StringVar(&r.Limit, "limit", "", "the upstream's limit, as pace.ParseLimit reads it (100/s, 5000/h, 10/s burst 20)")
	flags.IntVar(&r.InFlight, "in-flight", 0, "a cap of requests in flight (0: none)")
	flags.DurationVar(&r.MaxWait, "max-wait", defaultMaxWait, "the longest a request waits; a longer wait is answered 429 at once")
	flags.StringVar(&r.Name, "name", "upstream", "the route's name, which begins its keys")
	if err := flags.Parse(args); err != nil {
		return nil, "", err
	}
	if flags.NArg() > 0 {
		return nil, "", fmt.Errorf("pace serve takes no arguments, only flags: %q", flags.Args())
	}
	if *file != "" {
		if flags.NFlag() > 1 {
			return nil, "", errors.New("-config: the routes are in the file; no other flag goes with it")
		}
		config, err := readConfig(*file)
		if err != nil {
			return nil, "", err
		}
		return config, *file, config.check()
	}
	if err := flagMistake(c, r); err != nil {
		return nil, "", err
	}
	c.Routes = []routeConfig{r}
	c.fill()
	return &c, "", c.check()
}

// flagMistake returns what is wrong with the route the flags say, naming
// the flag, the value and a right one; nil when it is sound as far as
// flags go (the configuration's check does the rest).
func flagMistake(c serveConfig, r routeConfig) error {
	u, err := url.Parse(r.Upstream)
	switch {
	case r.Upstream == "":
		return errors.New("-upstream: want the upstream's URL, such as -upstream https://api.example.com")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("-upstream %q: want an http or https URL with its host, such as -upstream http://%s", r.Upstream, strings.TrimPrefix(r.Upstream, "//"))
	case r.Limit == "":
		return errors.New(`-limit: want the upstream's limit, such as -limit 100/s or -limit "5000 per hour"`)
	case c.Redis != "" && !strings.Contains(c.Redis, "://"):
		return fmt.Errorf("-redis %q: want a Redis URL, such as -redis redis://%s/0", c.Redis, c.Redis)
	}
	if _, err := pace.ParseLimit(r.Limit); err != nil {
		return fmt.Errorf("-limit: %w", err)
	}
	return nil
}

// A server is pace serve's routes on their addresses, with /healthz,
// /metrics and the wait endpoint on the first.
type server struct {
	config    serveConfig // as the server started: what a reload may not change
	buffer    *buffer     // of bytes held for estimates
	conns     *connCap    // of connections open
	logger    *slog.Logger
	table     atomic.Pointer[routeTable] // the routes served now
	addrs     []string                   // the addresses, the server's own first
	servers   []*http.Server
	listeners []net.Listener
	stop      context.CancelFunc // ends every wait
	closeAll  func()             // the limiters, the Redis client, the store
	serving   sync.WaitGroup
	stopped   sync.Once
	stopErr   error

	// What the routes are built with.
	store    store
	base     *http.Transport
	stopping context.Context // ended by a shutdown
	meters   *sdkmetric.MeterProvider
	metrics  http.Handler
	builtMu  sync.Mutex
	built    []*route // every route built, for the shutdown to close
}

// newServer builds c's routes on their Redis; ctx is the server's life,
// whose end the waits end with.
func newServer(ctx context.Context, c *serveConfig, logger *slog.Logger) (*server, error) {
	s := &server{config: *c, logger: logger, buffer: &buffer{left: c.MaxBuffered}, conns: newConnCap(c.MaxConnections)}
	st, closeStore, err := s.openStore()
	if err != nil {
		return nil, err
	}
	registry := prometheus.NewRegistry()
	exporter, err := otelprometheus.New(otelprometheus.WithRegisterer(registry))
	if err != nil {
		closeStore()
		return nil, err
	}
	s.store, s.base, s.metrics = st, upstreamBase(), promhttp.HandlerFor(registry, promhttp.HandlerOpts{})
	s.meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	s.stopping, s.stop = context.WithCancel(context.WithoutCancel(ctx))
	s.closeAll = func() {
		s.base.CloseIdleConnections()
		s.builtMu.Lock()
		closeRoutes(s.built)
		s.builtMu.Unlock()
		s.meters.Shutdown(context.Background())
		closeStore()
	}
	s.addrs = []string{c.Listen}
	for _, rc := range c.Routes {
		if !slices.Contains(s.addrs, rc.Listen) {
			s.addrs = append(s.addrs, rc.Listen)
		}
	}
	t, err := s.newTable(c, nil)
	if err != nil {
		s.close()
		return nil, err
	}
	s.table.Store(t)
	for _, addr := range s.addrs {
		s.servers = append(s.servers, &http.Server{Addr: addr, Handler: s.config.guard(s.dispatch(addr)),
			ReadHeaderTimeout: s.config.HeaderTimeout, IdleTimeout: s.config.IdleTimeout, ConnState: s.conns.state,
			MaxHeaderBytes: maxHeaderBytes})
	}
	return s, nil
}

// openStore returns the store of the configuration's Redis, or of an
// embedded one, and a function that closes it.
func (s *server) openStore() (store, func(), error) {
	url := s.config.Redis
	var embedded *miniredis.Miniredis
	if url == "" {
		var err error
		if embedded, err = miniredis.Run(); err != nil {
			return store{}, nil, err
		}
		url = "redis://" + embedded.Addr()
		s.logger.Warn("pace serve: no -redis: an embedded store paces this replica alone; give the replicas one Redis to share the quota")
	}
	options, err := redis.ParseURL(url)
	if err != nil {
		return store{}, nil, fmt.Errorf("redis %q: %w", url, err)
	}
	options.ContextTimeoutEnabled = true // pace's call timeout, without a goroutine
	client := redis.NewClient(options)
	closeStore := func() {
		client.Close()
		if embedded != nil {
			embedded.Close()
		}
	}
	return store{client: client, options: []pace.Option{pace.WithPrefix(s.config.Prefix)}}, closeStore, nil
}

// start checks the Redis, listens on every address and serves.
func (s *server) start() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, rt := range s.table.Load().routes {
		if err := rt.limiter.Check(ctx); err != nil {
			s.logger.Error("pace serve: Redis cannot pace the fleet; this replica paces alone until it can", "route", rt.config.Name, "err", err)
			break
		}
	}
	for _, srv := range s.servers {
		l, err := net.Listen("tcp", srv.Addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", srv.Addr, err)
		}
		s.listeners = append(s.listeners, s.conns.listener(l))
	}
	for i, srv := range s.servers {
		s.logger.Info("pace serve: listening", "addr", s.listeners[i].Addr().String())
		s.serving.Go(func() { srv.Serve(s.listeners[i]) })
	}
	return nil
}

// shutdown ends the waits (their tokens go back, their clients get a
// 503), lets the requests in flight end within the drain, and closes; once,
// however often it is called.
func (s *server) shutdown() error {
	s.stopped.Do(func() { s.stopErr = s.drain() })
	return s.stopErr
}

// drain is shutdown's work.
func (s *server) drain() error {
	s.logger.Info("pace serve: shutting down", "drain", s.config.Drain)
	s.stop()
	ctx, cancel := context.WithTimeout(context.Background(), s.config.Drain)
	defer cancel()
	var errs []error
	for _, srv := range s.servers {
		errs = append(errs, srv.Shutdown(ctx))
	}
	s.serving.Wait()
	closed := make(chan struct{})
	go func() {
		s.close()
		close(closed)
	}()
	// Closing the limiters ends their calls to Redis; a Redis that does not
	// answer (frozen) does not hold the shutdown past the drain.
	wait := time.NewTimer(max(time.Until(deadlineOf(ctx)), closeGrace))
	defer wait.Stop()
	select {
	case <-closed:
	case <-wait.C:
		s.logger.Warn("pace serve: shut down before the limiters closed: Redis did not answer", "drain", s.config.Drain)
	}
	return errors.Join(errs...)
}

// closeGrace is the least a shutdown waits for its limiters to close, even
// past the drain.
const closeGrace = 250 * time.Millisecond

// deadlineOf is ctx's deadline (zero for none).
func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// close closes what the server holds.
func (s *server) close() {
	for _, l := range s.listeners {
		l.Close()
	}
	s.closeAll()
}

// maxHeaderBytes bounds a request's line and headers, and so what a
// connection that sends them slowly pins (net/http's default is 1 MiB):
// more is a 431.
const maxHeaderBytes = 64 << 10

// upstreamBase returns the transport to the upstreams: Go's default, with
// the system's roots for TLS, and enough idle connections for thousands of
// requests a second, each copying request bodies through a small buffer.
func upstreamBase() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 512
	pooledCopies(t)
	return t
}

// both returns an Observer that tells a and b.
func both(a, b pace.Observer) pace.Observer {
	return func(ctx context.Context, e pace.Event) {
		a(ctx, e)
		b(ctx, e)
	}
}
