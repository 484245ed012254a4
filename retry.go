package pace

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/fleetpace/pace/headers"
)

// NewRetryClient returns a go-retryablehttp client whose every attempt goes
// through t: each attempt waits for its own token and honours the holds that
// responses set. It retries connection errors, 429s and 5xx responses
// (retryablehttp's DefaultRetryPolicy) up to 4 times, and any other response
// that holds its key (see headers.ParseHold and headers.HearBody), such as
// GitHub's 403 of a secondary limit (Retry-After, X-RateLimit-Remaining: 0,
// or only its message, which holds the key a minute and more), but not a wait that
// pace refused or could not decide (a *DeadlineError, ErrUnavailable, a bad
// key or cost): trying again would fail the same way. After a response that
// set a hold, it retries at once, since the next attempt's wait already lasts
// the hold; otherwise it backs off exponentially. It logs nothing. Request
// bodies are replayed on every attempt by retryablehttp.
func NewRetryClient(t *Transport) *retryablehttp.Client {
	c := retryablehttp.NewClient()
	c.HTTPClient = &http.Client{Transport: t}
	c.Logger = nil
	c.CheckRetry = retryPolicy
	c.Backoff = func(min, max time.Duration, attempt int, resp *http.Response) time.Duration {
		if resp != nil && holds(resp) {
			return 0
		}
		return retryablehttp.DefaultBackoff(min, max, attempt, resp)
	}
	return c
}

// retryPolicy is retryablehttp's DefaultRetryPolicy, except for the errors of
// a wait that pace refused or could not decide.
func retryPolicy(ctx context.Context, resp *http.Response, err error) (bool, error) {
	var refused *DeadlineError
	if errors.As(err, &refused) || errors.Is(err, ErrUnavailable) || errors.As(err, new(*requestError)) {
		return false, err
	}
	if err == nil && resp != nil && resp.StatusCode == http.StatusForbidden && ctx.Err() == nil {
		if holds(resp) {
			return true, nil // a rate limit's refusal: the next attempt waits out the hold
		}
	}
	return retryablehttp.DefaultRetryPolicy(ctx, resp, err)
}

// holds reports whether resp asked for a hold of its key: in its headers,
// or in the start of its body, which the Transport read (see pacing.heed).
func holds(resp *http.Response) bool {
	if _, held := headers.ParseHold(resp, time.Now(), DefaultMaxHold); held {
		return true
	}
	body := resp.Body
	if b, ok := body.(*endingBody); ok {
		body = b.body
	}
	read, ok := body.(*startRead)
	return ok && read.held.Load()
}
