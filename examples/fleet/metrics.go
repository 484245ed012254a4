package main

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/extra/paceotel"
)

// metrics serves a worker's metrics (paceotel's) as Prometheus text.
type metrics struct {
	observer pace.Observer
	url      string
	server   *http.Server
	provider *sdkmetric.MeterProvider
}

// serveMetrics serves the metrics of worker index on addr (host:port): on
// port + index, so that each worker process has its own, or on a free port
// for port 0.
func serveMetrics(addr string, index int) (*metrics, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, err
	}
	if port != 0 {
		port += index
	}
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return nil, err
	}
	m := &metrics{provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))}
	if m.observer, err = paceotel.NewObserver(paceotel.WithMeterProvider(m.provider), paceotel.WithName("fleet")); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	m.url = "http://" + ln.Addr().String() + "/metrics"
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	m.server = &http.Server{Handler: mux}
	go m.server.Serve(ln)
	return m, nil
}

// decisions scrapes the metrics and returns the sum of pace_decisions_total.
func (m *metrics) decisions() (float64, error) {
	resp, err := http.Get(m.url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if line := lines.Text(); strings.HasPrefix(line, "pace_decisions_total{") {
			value, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				return 0, err
			}
			sum += value
		}
	}
	return sum, lines.Err()
}

// close stops serving.
func (m *metrics) close() {
	m.server.Close()
	m.provider.Shutdown(context.Background())
}
