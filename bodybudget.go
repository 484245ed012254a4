package pace

import "context"

// A BodyBudget bounds the bytes of response bodies that Transports keep
// at once, across the requests whose contexts carry it (WithBodyBudget):
// the start of a refusal read for the hold it asks for (up to
// headers.BodySize), and the ends of a body kept for its Settler or body
// counters (up to 3*BodyEndSize). pace serve gives its max_buffered so, one
// budget with the request bodies it holds for estimates.
type BodyBudget interface {
	// Take takes n bytes of the budget, if they are left, and returns the
	// func that gives them back; nil if they are not.
	Take(n int64) (release func())
}

// WithBodyBudget returns ctx, whose requests' responses keep what a
// Transport reads of their bodies within b: past it, a refusal's body is
// not read for a hold (its headers are heard still), and a body's ends are
// not kept (its reservation keeps its estimate).
func WithBodyBudget(ctx context.Context, b BodyBudget) context.Context {
	return context.WithValue(ctx, bodyBudgetKey{}, b)
}

type bodyBudgetKey struct{}

// takeBody takes n bytes of the budget of ctx, if it carries one, and
// returns the func that gives them back; false when the budget has not n
// left.
func takeBody(ctx context.Context, n int64) (release func(), ok bool) {
	b, _ := ctx.Value(bodyBudgetKey{}).(BodyBudget)
	if b == nil {
		return func() {}, true
	}
	release = b.Take(n)
	return release, release != nil
}
