package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/natsrv"
)

// serveMain is `oncegate serve`. ready, when set, gets the gateway once it serves (tests).
func serveMain(ctx context.Context, args []string, stderr io.Writer, getenv func(string) string, ready func(*gateway.Gateway)) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "YAML configuration file")
	listen := fs.String("listen", "", "HTTP listen address (env ONCEGATE_LISTEN; default 127.0.0.1:8080)")
	dataDir := fs.String("data-dir", "", "embedded NATS data directory (default ./data)")
	role := fs.String("role", "", "all | api | worker")
	natsURL := fs.String("nats-url", "", "external NATS URL (default: embedded server)")
	natsListen := fs.String("nats-listen", "", "let the embedded NATS server listen on ADDR (default: no port)")
	natsCluster := fs.String("nats-cluster", "", "join the embedded NATS server to the cluster NAME (with --nats-cluster-listen and --nats-routes)")
	clusterListen := fs.String("nats-cluster-listen", "", "host:port the other cluster nodes' routes connect to")
	natsRoutes := fs.String("nats-routes", "", "every cluster node's route URL, this one included: nats://HOST:PORT,nats://HOST:PORT,...")
	natsReplicas := fs.Int("nats-replicas", 0, "replicas of every stream and bucket: 1, 3 or 5 (default: 3 on a cluster of 3 or more, else 1)")
	serverName := fs.String("nats-server-name", "", "this node's name in the cluster (default HOSTNAME-PORT of --nats-cluster-listen)")
	natsPartitions := fs.Int("nats-partitions", 0, "split the streams an intent touches into N partitions, 1 to 32 (fixed once the streams exist; default 1)")
	placePartitions := fs.Bool("nats-place-partitions", false, "put partition K's streams on the servers tagged og-pK (--nats-tags)")
	natsTags := fs.String("nats-tags", "", "this embedded server's placement tags, comma-separated (e.g. og-p0)")
	metricsListen := fs.String("metrics-listen", "", "also serve /metrics, unauthenticated, on this host:port (any role)")
	pprofAddr := fs.String("pprof", "", "serve net/http/pprof on this loopback ADDR (profiling)")
	tlsCert := fs.String("tls-cert", "", "serve the HTTP API over TLS with this PEM certificate (chain) file (with --tls-key)")
	tlsKey := fs.String("tls-key", "", "the PEM private key file of --tls-cert")
	dashboardPublic := fs.Bool("dashboard-public", false, "serve /dashboard to any client when no tenants are configured (default: loopback only)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := config.LoadWith(*configPath, getenv)
	if err != nil {
		fmt.Fprintf(stderr, "oncegate: %v\n", err)
		return 1
	}
	override := func(v string, dst *string) {
		if v != "" {
			*dst = v
		}
	}
	override(*listen, &cfg.Listen)
	override(*dataDir, &cfg.DataDir)
	override(*role, &cfg.Role)
	override(*natsURL, &cfg.NATS.URL)
	override(*natsListen, &cfg.NATS.Listen)
	override(*natsCluster, &cfg.NATS.Cluster.Name)
	override(*clusterListen, &cfg.NATS.Cluster.Listen)
	override(*serverName, &cfg.NATS.Cluster.ServerName)
	override(*metricsListen, &cfg.Metrics.Listen)
	override(*tlsCert, &cfg.HTTP.TLSCert)
	override(*tlsKey, &cfg.HTTP.TLSKey)
	if *dashboardPublic {
		cfg.Dashboard.Public = true
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "nats-replicas":
			cfg.NATS.Replicas = *natsReplicas
		case "nats-partitions":
			cfg.NATS.Partitions = *natsPartitions
		case "nats-place-partitions":
			cfg.NATS.PlacePartitions = *placePartitions
		}
	})
	if *natsTags != "" {
		cfg.NATS.Cluster.Tags = strings.Split(*natsTags, ",")
	}
	if *natsRoutes != "" {
		cfg.NATS.Cluster.Routes = strings.Split(*natsRoutes, ",")
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "oncegate: %v\n", err)
		return 1
	}
	log := newLogger(stderr, cfg.LogLevel)
	if *pprofAddr != "" {
		stopPprof, err := servePprof(*pprofAddr)
		if err != nil {
			fmt.Fprintln(stderr, startFailure(err))
			return 1
		}
		defer stopPprof()
		log.Info().Str("pprof", "http://"+*pprofAddr+"/debug/pprof/").Msg("profiling endpoint")
	}
	gw, err := gateway.Start(ctx, cfg, log, getenv)
	if err != nil {
		fmt.Fprintln(stderr, startFailure(err))
		return 1
	}
	limit, source := memoryLimit(getenv)
	log.Info().Int64("go_memory_limit", limit).Str("source", source).Msg("Go memory limit")
	if ready != nil {
		ready(gw)
	}
	<-ctx.Done()
	log.Info().Msg("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.HTTP.ShutdownGrace.D()+5*time.Second)
	defer cancel()
	if err := gw.Stop(sctx); err != nil {
		log.Error().Err(err).Msg("shutdown")
		return 1
	}
	log.Info().Msg("stopped")
	return 0
}

// startFailure is the one line a failed start prints: what failed and, when a flag fixes it,
// which flag. No stack, no JSON: it is read by the person who just typed the command.
func startFailure(err error) string {
	msg := "oncegate: " + strings.ReplaceAll(err.Error(), "\n", "; ")
	var se *gateway.StartError
	if !errors.As(err, &se) {
		return msg
	}
	switch {
	case se.Field == "listen":
		return msg + "; pass --listen"
	case se.Field == "http.tls_cert":
		return msg + "; pass a readable PEM certificate and its key as --tls-cert and --tls-key"
	case se.Field == "metrics.listen":
		return msg + "; pass another --metrics-listen"
	case se.Field == "nats.listen":
		return msg + "; pass another --nats-listen"
	case se.Field == "nats.cluster.listen":
		return msg + "; pass another --nats-cluster-listen"
	case se.Field == "nats.cluster.routes":
		return msg + "; start the other nodes, or fix --nats-routes"
	case se.Field == "data_dir" && errors.Is(err, natsrv.ErrLocked):
		return msg + "; stop it, or pass another --data-dir"
	case se.Field == "data_dir":
		return msg + "; pass a writable directory as --data-dir"
	case se.Field == "pprof":
		return msg + "; pass a free loopback address as --pprof, e.g. 127.0.0.1:6060"
	}
	return msg
}

func newLogger(w io.Writer, level string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger()
}
