package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/redis/go-redis/v9"
)

// runReset runs pace reset: it lists the Redis keys of the keys named, and
// unlinks them with -yes.
func runReset(ctx context.Context, args []string, out, errOut io.Writer) error {
	flags := newFlags("reset", errOut)
	target := redisFlags(flags)
	yes := flags.Bool("yes", false, "unlink the keys; without it, list what would be unlinked")
	if err := flags.Parse(args); err != nil {
		return err
	}
	client, err := target.connect()
	if err != nil {
		return err
	}
	defer client.Close()
	return reset(ctx, out, client, *target.prefix, flags.Args(), *yes)
}

// reset clears the state of the keys named (see matches) under prefix:
// with yes, it unlinks their Redis keys, readBatch a round trip; without,
// it lists what it would unlink, and unlinks nothing.
func reset(ctx context.Context, w io.Writer, c redis.UniversalClient, prefix string, keys []string, yes bool) error {
	if len(keys) == 0 {
		return errors.New("reset: name the keys to clear: a key, a rule's name or a host")
	}
	names, err := scan(ctx, c, prefix, keys)
	if err != nil {
		return err
	}
	if !yes {
		fmt.Fprintf(w, "reset would unlink %d Redis keys:\n", len(names))
		for _, name := range names {
			fmt.Fprintf(w, "  %q\n", name)
		}
		fmt.Fprintln(w, "run it again with -yes to unlink them")
		return nil
	}
	unlinked := int64(0)
	for batch := range slices.Chunk(names, readBatch) {
		pipe := c.Pipeline()
		cmds := make([]*redis.IntCmd, len(batch))
		for i, name := range batch {
			cmds[i] = pipe.Unlink(ctx, name) // one key a command: a cluster's keys lie in many slots
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("reset: after %d of %d Redis keys: %w", unlinked, len(names), err)
		}
		for _, cmd := range cmds {
			unlinked += cmd.Val()
		}
	}
	fmt.Fprintf(w, "reset unlinked %d Redis keys\n", unlinked)
	return nil
}
