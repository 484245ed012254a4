// Package snippets is where the Go code blocks of the README and of docs/
// are compiled, by its test, which writes each block into it through an
// overlay (see snippets_test.go). Its imports are the packages the blocks
// may use, so that the module requires them.
package snippets

import (
	_ "github.com/fleetpace/pace"
	_ "github.com/fleetpace/pace/extra/paceotel"
	_ "github.com/hashicorp/go-retryablehttp"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/redis/go-redis/v9/logging"
)
