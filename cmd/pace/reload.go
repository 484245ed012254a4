package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"sync/atomic"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/extra/paceotel"
)

// A routeTable is the routes a server serves, on its addresses: a reload
// builds a new one and swaps it in. A request serves from the table it
// found until it ends (its wait, its upstream exchange, an upgraded
// connection), so a reload never cuts one short: the table it left is
// retired, and its routes that the new table does not keep are closed
// once its last request has ended.
type routeTable struct {
	routes   []*route                // in the configuration's order
	handlers map[string]http.Handler // by address

	state atomic.Int64  // the requests serving from the table, with retired set once a newer table took its place
	idle  chan struct{} // closed once retired with no requests
}

// retired is the bit of a routeTable's state that says it is retired.
const retired = int64(1) << 62

// enter notes a request that serves from t, unless t is retired.
func (t *routeTable) enter() bool {
	for {
		v := t.state.Load()
		if v&retired != 0 {
			return false
		}
		if t.state.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

// leave notes the end of a request that entered t.
func (t *routeTable) leave() {
	if t.state.Add(-1) == retired {
		close(t.idle) // the last request of a retired table
	}
}

// retire marks t retired, and returns a channel closed once its last
// request has ended.
func (t *routeTable) retire() <-chan struct{} {
	if t.state.Or(retired) == 0 {
		close(t.idle) // no request under way
	}
	return t.idle
}

// dispatch is the handler of the server's address addr: the current
// table's, for the whole of each request.
func (s *server) dispatch(addr string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for {
			t := s.table.Load()
			if !t.enter() {
				continue // retired meanwhile: the newer one is stored already
			}
			defer t.leave()
			t.handlers[addr].ServeHTTP(w, r)
			return
		}
	})
}

// newTable builds the routes of c on the server's addresses. A route whose
// configuration old has too is old's route, its limiters and their state
// kept; the others are built anew (and closed again should one fail).
func (s *server) newTable(c *serveConfig, old *routeTable) (*routeTable, error) {
	t := &routeTable{idle: make(chan struct{})}
	var built []*route
	for _, rc := range c.Routes {
		rt := old.keeps(rc)
		if rt == nil {
			var err error
			if rt, err = s.newRoute(rc); err != nil {
				closeRoutes(built)
				return nil, fmt.Errorf("route %q: %w", rc.Name, err)
			}
			built = append(built, rt)
		}
		t.routes = append(t.routes, rt)
	}
	t.handlers = s.handlers(t.routes)
	return t, nil
}

// keeps returns t's route of configuration rc, if t has one (nil for a
// nil t).
func (t *routeTable) keeps(rc routeConfig) *route {
	if t == nil {
		return nil
	}
	for _, rt := range t.routes {
		if reflect.DeepEqual(rt.config, rc) {
			return rt
		}
	}
	return nil
}

// newRoute builds the route of rc, with its observer.
func (s *server) newRoute(rc routeConfig) (*route, error) {
	observer, err := paceotel.NewObserver(paceotel.WithName(rc.Name), paceotel.WithMeterProvider(s.meters))
	if err != nil {
		return nil, err
	}
	st := s.store
	st.options = append(slices.Clip(st.options), pace.WithObserver(both(observer, pace.SlogObserver(s.logger))))
	rt, err := newRoute(rc, st, s.base, s.stopping, s.buffer)
	if err == nil {
		s.builtMu.Lock()
		s.built = append(s.built, rt)
		s.builtMu.Unlock()
	}
	return rt, err
}

// handlers returns the handler of each of the server's addresses: its
// routes by path, and, on the first, the wait endpoint, /healthz and
// /metrics.
func (s *server) handlers(routes []*route) map[string]http.Handler {
	muxes := map[string]*http.ServeMux{}
	for _, addr := range s.addrs {
		muxes[addr] = http.NewServeMux()
	}
	for _, rt := range routes {
		muxes[rt.config.Listen].Handle(rt.config.Path, rt)
	}
	first := muxes[s.config.Listen]
	first.HandleFunc("POST "+waitPath, waitHandler(routes))
	first.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	first.Handle("GET /metrics", s.metrics)
	handlers := map[string]http.Handler{}
	for addr, mux := range muxes {
		handlers[addr] = mux
	}
	return handlers
}

// reload reads the configuration at path again and, if it is sound and
// changes only routes on the addresses the server listens on, serves it
// from the next request on; requests under way end as they began. Anything
// else is refused with an error, and the configuration before it serves
// on.
func (s *server) reload(path string) error {
	c, err := readConfig(path)
	if err == nil {
		err = c.check()
	}
	if err == nil {
		err = s.reloadable(c)
	}
	var t *routeTable
	if err == nil {
		t, err = s.newTable(c, s.table.Load())
	}
	if err != nil {
		return fmt.Errorf("reload %s: %w", path, err)
	}
	old := s.table.Swap(t)
	for _, rt := range t.routes {
		if !slices.Contains(old.routes, rt) {
			if err := rt.announce(context.WithoutCancel(s.stopping)); err != nil {
				s.logger.Warn("pace serve: reload: the route's limits were not announced", "route", rt.config.Name, "err", err)
			}
		}
	}
	dropped := slices.DeleteFunc(slices.Clone(old.routes), func(rt *route) bool { return slices.Contains(t.routes, rt) })
	go func() {
		<-old.retire()
		s.closeDropped(dropped)
	}()
	return nil
}

// closeDropped closes the routes a reload dropped, and forgets them.
func (s *server) closeDropped(dropped []*route) {
	closeRoutes(dropped)
	s.builtMu.Lock()
	defer s.builtMu.Unlock()
	s.built = slices.DeleteFunc(s.built, func(rt *route) bool { return slices.Contains(dropped, rt) })
}

// reloadable returns what keeps c from replacing the server's
// configuration by a reload: a change beyond its routes (Redis, the
// prefix, the addresses, the bounds), which takes a restart.
func (s *server) reloadable(c *serveConfig) error {
	now, next := s.config, *c
	now.Routes, next.Routes = nil, nil
	if !reflect.DeepEqual(now, next) {
		return errors.New("only routes change on a reload: redis, prefix, listen, drain and the bounds take a restart")
	}
	for _, rc := range c.Routes {
		if !slices.Contains(s.addrs, rc.Listen) {
			return fmt.Errorf("route %q: listen %s: a new address takes a restart", rc.Name, rc.Listen)
		}
	}
	return nil
}

// closeRoutes closes routes.
func closeRoutes(routes []*route) {
	for _, rt := range routes {
		rt.close()
	}
}
