package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestLeaseRepliesBounded: a lease's reply is checked before a process
// hands out a token of it. The script's own reply on a bucket with room
// passes; a reply of more tokens than asked, a lease beginning beyond the
// budget, or one whose span outlasts the burst's refill (which would let
// tokens go long after the bucket refilled behind them) is an error that
// names the reply.
func TestLeaseRepliesBounded(t *testing.T) {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer client.Close()
	forged := &replyForger{}
	client.AddHook(forged)
	s := New(NewCaller(client, time.Second), "p:", "m", []Limit{{Kind: Bucket, Span: 1000, Count: 100}}) // 1,000/s burst 100: a refill of 100 ms
	got, err := s.LeaseTokens(ctx, "k", 10, 20*time.Millisecond, time.Second)
	if err != nil || got.Tokens != 10 || got.Begin != 0 || got.End != 20*time.Millisecond {
		t.Fatalf("the script's lease: %+v, %v; want 10 tokens from now for 20ms", got, err)
	}
	for _, reply := range [][]any{
		{int64(11), int64(0), int64(20000), int64(1)},         // more than asked
		{int64(10), int64(2000000), int64(2010000), int64(1)}, // beyond the budget
		{int64(10), int64(0), int64(100001), int64(1)},        // longer than the burst's refill
		{int64(10), int64(5000), int64(4000), int64(1)},       // ending before it begins
	} {
		forged.reply = reply
		if got, err := s.LeaseTokens(ctx, "k", 10, 20*time.Millisecond, time.Second); err == nil || !strings.Contains(err.Error(), "replied") {
			t.Errorf("reply %v: %+v, %v; want an error that names the reply", reply, got, err)
		}
	}
}

// replyForger is a go-redis hook that replaces a call's reply with reply,
// when set.
type replyForger struct{ reply []any }

func (f *replyForger) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *replyForger) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok && f.reply != nil && err == nil {
			c.SetVal(f.reply)
		}
		return err
	}
}

func (f *replyForger) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
