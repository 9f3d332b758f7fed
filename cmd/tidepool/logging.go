package main

import (
	"bytes"

	"github.com/cloudwego/kitex/pkg/klog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newLogger builds the process logger from the config.
func newLogger(level, format string) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, err
	}
	var cfg zap.Config
	if format == "json" {
		cfg = zap.NewProductionConfig()
	} else {
		cfg = zap.NewDevelopmentConfig()
		cfg.DisableStacktrace = true
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.OutputPaths = []string{"stderr"}
	cfg.ErrorOutputPaths = []string{"stderr"}
	return cfg.Build()
}

// zapWriter turns each line written to it into one zap entry; it bridges
// the loggers of libraries (Kitex's klog) that only take an io.Writer.
type zapWriter struct {
	lg *zap.Logger
}

func (w zapWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		msg := string(line)
		switch {
		case bytes.Contains(line, []byte("[Error]")), bytes.Contains(line, []byte("[Fatal]")):
			w.lg.Error("library log", zap.String("line", msg))
		case bytes.Contains(line, []byte("[Warn]")):
			w.lg.Warn("library log", zap.String("line", msg))
		default:
			w.lg.Debug("library log", zap.String("line", msg))
		}
	}
	return len(p), nil
}

// bridgeKitexLogs sends Kitex's klog output through zap.
func bridgeKitexLogs(lg *zap.Logger) {
	klog.SetOutput(zapWriter{lg: lg.Named("kitex")})
	if lg.Core().Enabled(zap.DebugLevel) {
		klog.SetLevel(klog.LevelDebug)
	} else {
		klog.SetLevel(klog.LevelWarn)
	}
}
