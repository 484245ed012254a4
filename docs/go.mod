module github.com/fleetpace/pace/docs

go 1.26.0

replace (
	github.com/fleetpace/pace => ..
	github.com/fleetpace/pace/extra/paceotel => ../extra/paceotel
)

require (
	github.com/fleetpace/pace v0.0.0-00010101000000-000000000000
	github.com/fleetpace/pace/extra/paceotel v0.0.0-00010101000000-000000000000
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)
