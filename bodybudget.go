package pace

import "context"

// WithBodyBudget returns ctx, whose requests' responses keep what a
// Transport reads of their bodies within a budget of bytes, shared by the
// requests whose contexts carry it: take takes n bytes of it, if they are
// left, and returns the func that gives them back; nil if they are not.
// What counts: the start of a refusal, read for the hold it asks for (up to
// headers.BodySize), and the ends of a body kept for its Settler or body
// counters (up to 3*BodyEndSize). Past the budget, a refusal's body is not
// read for a hold (its headers are heard still), and a body's ends are not
// kept (its reservation keeps its estimate). pace serve gives its
// max_buffered so, one budget with the request bodies it holds for
// estimates.
func WithBodyBudget(ctx context.Context, take func(n int64) (release func())) context.Context {
	return context.WithValue(ctx, bodyBudgetKey{}, take)
}

type bodyBudgetKey struct{}

// takeBody takes n bytes of the budget of ctx, if it carries one, and
// returns the func that gives them back; false when the budget has not n
// left.
func takeBody(ctx context.Context, n int64) (release func(), ok bool) {
	take, _ := ctx.Value(bodyBudgetKey{}).(func(int64) func())
	if take == nil {
		return func() {}, true
	}
	release = take(n)
	return release, release != nil
}
