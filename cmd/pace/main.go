// Command pace shows operators what a fleet's limiters keep in Redis,
// clears a key's state, and serves pace's quota to fleets in any
// language, as a reverse proxy before each upstream (see docs/serve.md).
//
//	pace serve   -upstream URL -limit TEXT [-listen ADDR] [-redis URL]
//	pace serve   -config FILE
//	pace inspect -redis URL [-prefix P] [KEY...]
//	pace watch   -redis URL [-prefix P] [-every 1s] [KEY...]
//	pace inspect -cluster HOST:PORT,HOST:PORT [KEY...]
//	pace reset   -redis URL [-prefix P] [-yes] KEY...
//
// For each key: the kind of each limit, how far ahead its schedule is
// booked, how full each window is, holds in force and until when, the
// bookings given back (gaps), the slots of a cap in flight and the line
// for them; and the fleets' members with their last heartbeat. It scans
// (SCAN, never KEYS), every master of a cluster, and reads each key in
// bounded commands (a count and the first and last members of a set,
// never the whole set; the first KiB of a string), 500 keys a round trip,
// so that Redis is never blocked: 100,000 keys take about a second. Keys
// are quoted; a key whose data is not pace's, or that expired meanwhile,
// says so on its line, and the report goes on. watch refreshes the report
// every second. A KEY names a key as a limiter was given it, a rule's name
// (its keys begin with it) or a host, with or without its port. reset
// lists the Redis keys of the KEYs named, and unlinks them with -yes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return
	case err != nil:
		fmt.Fprintln(os.Stderr, "pace:", err)
		os.Exit(2)
	}
}

const usage = `usage:
  pace serve -upstream URL -limit TEXT [-listen ADDR] [-redis URL]   a reverse proxy that paces (or -config FILE)
  pace inspect -redis URL [-prefix P] [-limit L]... [-json] [KEY...]   what pace keeps in Redis, per key
  pace watch -redis URL [-prefix P] [-limit L]... [-every D] [KEY...]   the same, again every D
  pace reset -redis URL [-prefix P] [-yes] KEY...         clear the keys' state (a dry run without -yes)
(-cluster HOST:PORT,... instead of -redis for a Redis Cluster; a KEY is a key,
a rule's name, or a host, with or without its port)
`

// run runs the command of args, writing its report to out.
func run(ctx context.Context, args []string, out, errOut io.Writer) error {
	if len(args) > 0 && args[0] == "serve" {
		return serve(ctx, args[1:], errOut)
	}
	if len(args) == 0 || !slices.Contains([]string{"inspect", "watch", "reset"}, args[0]) {
		fmt.Fprint(errOut, usage)
		return errors.New("want a command: serve, inspect, watch or reset")
	}
	command := args[0]
	flags := flag.NewFlagSet("pace "+command, flag.ContinueOnError)
	flags.SetOutput(errOut)
	flags.Usage = func() {
		fmt.Fprint(errOut, usage+"\nflags of pace "+command+":\n")
		flags.PrintDefaults()
	}
	url := flags.String("redis", "", "the Redis URL (redis://HOST:PORT/DB)")
	cluster := flags.String("cluster", "", "the addresses of a Redis Cluster's nodes, separated by commas")
	prefix := flags.String("prefix", pace.DefaultPrefix, "the prefix of pace's keys (WithPrefix)")
	var every *time.Duration
	var asJSON, yes *bool
	known := limits{}
	switch command {
	case "inspect", "watch":
		flags.Var(known, "limit", "a limit as pace.ParseLimit reads it, TEXT for a quota of one unnamed limit or NAME=TEXT for a named one, so that the report says what is left (again for each)")
		asJSON = flags.Bool("json", false, "write the report as JSON")
		if command == "watch" {
			every = flags.Duration("every", time.Second, "how often to refresh")
		}
	case "reset":
		yes = flags.Bool("yes", false, "unlink the keys; without it, list what would be unlinked")
	}
	if err := flags.Parse(args[1:]); err != nil {
		return err
	}
	if every != nil && *every <= 0 {
		return fmt.Errorf("-every %v: want a positive duration", *every)
	}
	client, err := connect(*url, *cluster)
	if err != nil {
		return err
	}
	defer client.Close()
	switch command {
	case "inspect":
		return inspect(ctx, out, client, *prefix, flags.Args(), known, *asJSON)
	case "reset":
		return reset(ctx, out, client, *prefix, flags.Args(), *yes)
	}
	for {
		fmt.Fprint(out, "\033[H\033[2J")
		if err := inspect(ctx, out, client, *prefix, flags.Args(), known, *asJSON); err != nil {
			return err
		}
		time.Sleep(*every)
	}
}

// connect returns a client of the Redis at url, or of the cluster whose
// nodes are listed.
func connect(url, cluster string) (redis.UniversalClient, error) {
	switch {
	case (url == "") == (cluster == ""):
		return nil, errors.New("want one of -redis URL and -cluster HOST:PORT,...")
	case cluster != "":
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(cluster, ",")}), nil
	}
	options, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("-redis %q: %w", url, err)
	}
	return redis.NewClient(options), nil
}
