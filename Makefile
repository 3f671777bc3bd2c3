# GMLake build. `make` builds everything into build/; `make test` installs
# missing Debian packages, then runs the whole suite plain and under
# ASan+UBSan (LeakSanitizer included, so the multi-process tests check leaks
# in the daemon and in every client process).
PREFIX ?= /usr/local
DESTDIR ?=
BUILD ?= build
CC ?= cc
SAN ?= 0
MANDIR ?= $(PREFIX)/share/man
LIBDIR ?= $(PREFIX)/lib
SYSCONFDIR ?= /etc
# make test compiles its three builds on every core (the suites themselves run one at a time)
JOBS ?= $(shell nproc 2>/dev/null || echo 1)

# -fvisibility=hidden: the library exports only what include/gmlake.h marks GML_API.
CFLAGS_BASE := -std=gnu11 -Wall -Wextra -Werror -g -fPIC -fvisibility=hidden -D_GNU_SOURCE -pthread
ifeq ($(SAN),1)
  OPT := -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
  LDSAN := -fsanitize=address,undefined
else ifeq ($(SAN),thread)
  # ThreadSanitizer (make tsan): not part of `make test`
  OPT := -O1 -fno-omit-frame-pointer -fsanitize=thread
  LDSAN := -fsanitize=thread
else ifeq ($(SAN),fuzz)
  # libFuzzer targets (make fuzz): coverage for the fuzzer, ASan+UBSan for what it finds
  OPT := -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
  LDSAN := -fsanitize=address,undefined
else
  OPT := -O2
  LDSAN :=
endif
# Each folder is compiled with the include paths of what it may use (tests/layers.py checks the
# calls): common/ (and the generated protobuf code) sees only itself; client/ and daemon/ see
# common/, never each other; tools/ sees the client's; tests/ and bench/ see everything.
INC_common := -Iinclude -Icommon -I$(BUILD)/gen
INC_gen := $(INC_common)
INC_client := $(INC_common) -Iclient
INC_daemon := $(INC_common) -Idaemon
INC_tools := $(INC_common) -Iclient -Itools
INC_tests := $(INC_common) -Iclient -Idaemon -Itools
INC_bench := $(INC_tests)
CFLAGS := $(CFLAGS_BASE) $(OPT) $(EXTRA_CFLAGS)
LDFLAGS := $(LDSAN) -pthread $(EXTRA_LDFLAGS)
CHECK_LIBS ?= $(shell pkg-config --libs check)

GEN := $(BUILD)/gen/gmlake.pb-c.c $(BUILD)/gen/gmlake.pb-c.h
COMMON_SRC := common/options.c common/log.c common/util.c common/gpuname.c common/fdkeep.c common/backend.c common/backend_host.c common/backend_cuda.c common/backend_cuda_peer.c common/wire.c
CLIENT_SRC := client/alloc.c client/blocks.c client/slots.c client/policy.c client/alloc_check.c client/guard.c client/client.c client/settings.c client/torch.c client/growable.c client/discover.c client/share.c
CLIENT_SRC += client/records.c client/release.c client/track.c client/streams.c client/pools.c client/checkpoint.c client/devices.c client/ipc.c client/ipc_fds.c client/meminfo.c client/torchconf.c  # the framework layer's C API
DAEMON_SRC := daemon/main.c daemon/names.c daemon/hello.c daemon/config.c daemon/lake.c daemon/broker.c daemon/lakesize.c daemon/conn.c daemon/session.c daemon/dispatch.c daemon/meminfo.c daemon/park.c daemon/grant.c daemon/creator.c daemon/control.c daemon/shares.c daemon/ctlsock.c daemon/listen.c daemon/trust.c daemon/metrics.c daemon/adopt.c daemon/pidquota.c daemon/fdbudget.c daemon/quotas.c
CLIENT_SRC += client/open.c client/lease.c client/report.c client/link.c client/keeper.c client/hello.c client/adopt.c client/reclaim.c client/pause.c client/snapshot.c
CLIENT_SRC += client/plan.c client/plan_keep.c  # placement planned from a recorded iteration (no allocator in it)
CLIENT_SRC += client/copy.c client/staging.c client/paths.c client/mpath.c  # the copy engine (gml_copy*); paths.c, mpath.c: multi-path policy, mechanism
CLIENT_SRC += client/swap.c client/swap_use.c  # the swap plan of a recorded iteration (no allocator in swap.c)
CLIENT_SRC += client/planned.c  # ... served by the allocator

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
COMMON_OBJ := $(call obj,$(COMMON_SRC)) $(BUILD)/obj/gen/gmlake.pb-c.o
CLIENT_OBJ := $(call obj,$(CLIENT_SRC))
DAEMON_OBJ := $(call obj,$(DAEMON_SRC) common/statsview.c)

LIBS := -lprotobuf-c -ldl
BINS := $(BUILD)/gmlaked $(BUILD)/gmlakectl $(BUILD)/gmlake-replay $(BUILD)/libgmlake-client.so \
        $(BUILD)/libgmlake-client.a $(BUILD)/gmlake.pc
TESTS := $(BUILD)/test_unit $(BUILD)/test_integration $(BUILD)/test_elastic $(BUILD)/test_security $(BUILD)/gml-testclient $(BUILD)/test_plan $(BUILD)/test_copy $(BUILD)/test_swap \
         $(BUILD)/test_planned

# slurm/gmlake_spank.c: the Slurm SPANK plugin, built where libslurm-dev's spank.h is (scripts/deps.sh installs it).
SPANK_H ?= $(wildcard /usr/include/slurm/spank.h)
SLURM_PLUGIN := $(if $(SPANK_H),$(BUILD)/gmlake_spank.so)

.PHONY: all bins borrow-model clean format tsan test check-plain check-san check-fuzz fuzz fuzz-corpus deps install uninstall wheel deb demo cuda-header-check
all: $(BINS) $(TESTS) $(SLURM_PLUGIN)
# what make install installs, without the tests (the Debian packages' build: no check library needed)
bins: $(BINS)

$(GEN): proto/gmlake.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen -Iproto proto/gmlake.proto

$(BUILD)/obj/gen/gmlake.pb-c.o: $(BUILD)/gen/gmlake.pb-c.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_gen) -Wno-unused-parameter -c $< -o $@

$(BUILD)/obj/%.o: %.c $(GEN) $(wildcard common/*.h client/*.h include/*.h daemon/*.h tools/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_$(firstword $(subst /, ,$*))) -c $< -o $@

$(BUILD)/libgmlake-client.so: $(CLIENT_OBJ) $(COMMON_OBJ)
	$(CC) -shared -Wl,-soname,libgmlake-client.so.1 -o $@ $^ $(LDFLAGS) $(LIBS)
	ln -sf libgmlake-client.so $(BUILD)/libgmlake-client.so.1  # its soname: what programs linked to it load

$(BUILD)/libgmlake-client.a: $(CLIENT_OBJ) $(COMMON_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/gmlaked: $(DAEMON_OBJ) $(COMMON_OBJ)
	$(CC) -o $@ $^ $(LDFLAGS) -luv -lnng $(LIBS)

$(BUILD)/gmlakectl: $(call obj,tools/gmlakectl.c tools/ctl_endpoint.c tools/ctl_tables.c tools/ctl_node.c tools/ctl_paths.c common/statsview.c) $(BUILD)/libgmlake-client.a
	$(CC) -o $@ $^ $(LDFLAGS) -lnng $(LIBS)

$(BUILD)/gmlake-replay: $(call obj,tools/replay.c tools/replay_steps.c tools/replay_plan.c tools/replay_planned.c common/statsview.c) $(BUILD)/libgmlake-client.a
	$(CC) -o $@ $^ $(LDFLAGS) -lz $(LIBS)

$(BUILD)/test_unit: $(call obj,tests/test_unit.c tests/test_alloc.c tests/test_lake.c tests/test_broker.c tests/test_policy.c tests/test_config.c tests/test_wire.c \
                      tests/test_growable.c tests/test_api.c tests/test_pause.c tests/test_guard.c tests/test_borrow.c tests/test_layer.c tests/test_partial.c tests/test_snapshot.c tests/backends.c \
                      tests/test_usage.c) $(call obj,daemon/lake.c daemon/broker.c daemon/quotas.c daemon/meminfo.c daemon/lakesize.c daemon/config.c common/statsview.c) \
                    $(BUILD)/libgmlake-client.a
	$(CC) -o $@ $^ $(LDFLAGS) $(CHECK_LIBS) $(LIBS)

# The multi-process suites share tests/harness.c (a daemon, clients, gmlakectl, raw wire);
# test_lake and test_broker the lake of tests/lake_fixture.h.
$(call obj,tests/harness.c tests/test_integration.c tests/test_elastic.c tests/test_security.c): tests/harness.h
$(call obj,tests/test_lake.c tests/test_broker.c): tests/lake_fixture.h
# tests/backends.c: the tests' backends (fake events, a driver's costs), over the library's host backend.
$(call obj,tests/backends.c tests/test_borrow.c tests/testclient.c bench/borrow_model.c): tests/backends.h

$(BUILD)/test_integration: $(call obj,tests/test_integration.c tests/harness.c) $(BUILD)/libgmlake-client.a
	$(CC) -o $@ $^ $(LDFLAGS) $(CHECK_LIBS) $(LIBS)

$(BUILD)/test_elastic: $(call obj,tests/test_elastic.c tests/harness.c) $(BUILD)/libgmlake-client.a
	$(CC) -o $@ $^ $(LDFLAGS) $(CHECK_LIBS) $(LIBS)

$(BUILD)/test_security: $(call obj,tests/test_security.c tests/harness.c) $(BUILD)/libgmlake-client.a
	$(CC) -o $@ $^ $(LDFLAGS) $(CHECK_LIBS) -lnng $(LIBS)

# The planner, server and keeper alone: plan.c has no allocator in it.
$(BUILD)/test_plan: $(call obj,tests/test_plan.c client/plan.c client/plan_keep.c)
	$(CC) -o $@ $^ $(LDFLAGS) $(CHECK_LIBS)

# The copy engine over a backend whose copies run only when waited for (tests/test_copy.c).
$(BUILD)/test_copy: $(call obj,tests/test_copy.c) $(BUILD)/libgmlake-client.a
	$(CC) -o $@ $^ $(LDFLAGS) $(CHECK_LIBS) $(LIBS)
# The swap planner (swap.c has no client in it), and its setting and numbers on a host client.
$(BUILD)/test_swap: $(call obj,tests/test_swap.c) $(BUILD)/libgmlake-client.a
	$(CC) -o $@ $^ $(LDFLAGS) $(CHECK_LIBS) $(LIBS)
# ... and served by the allocator (client/planned.c), with its invariant checker after every operation.
$(BUILD)/test_planned: $(call obj,tests/test_planned.c) $(BUILD)/libgmlake-client.a
	$(CC) -o $@ $^ $(LDFLAGS) $(CHECK_LIBS) $(LIBS)

$(BUILD)/gml-testclient: $(call obj,tests/testclient.c tests/backends.c) $(BUILD)/libgmlake-client.a
	$(CC) -o $@ $^ $(LDFLAGS) $(LIBS)

# bench/borrow_model.c: bench/borrow.py's two replicas on the host, borrowing off and on (not in `all`).
borrow-model: $(BUILD)/borrow-model
$(BUILD)/borrow-model: $(call obj,bench/borrow_model.c tests/backends.c) $(BUILD)/libgmlake-client.a
	$(CC) -o $@ $^ $(LDFLAGS) -lz $(LIBS)

# Loaded by slurmd and slurmstepd, which are not sanitized: never built with SAN (the san build's Slurm test
# covers the daemon, gmlakectl and the clients under ASan). Its own symbols visible (Slurm dlsym's them),
# common/util.c's hidden.
$(BUILD)/gmlake_spank.so: slurm/gmlake_spank.c common/util.c common/util.h include/gmlake.h
	@mkdir -p $(BUILD)/obj/slurm
	$(CC) $(CFLAGS_BASE) -O2 -Iinclude -Icommon -c common/util.c -o $(BUILD)/obj/slurm/util.o
	$(CC) $(CFLAGS_BASE) -O2 -fvisibility=default -Iinclude -Icommon -DGMLAKE_BINDIR='"$(PREFIX)/bin"' \
	  -c slurm/gmlake_spank.c -o $(BUILD)/obj/slurm/gmlake_spank.o
	$(CC) -shared -o $@ $(BUILD)/obj/slurm/gmlake_spank.o $(BUILD)/obj/slurm/util.o -pthread

# Fuzz targets (tests/fuzz/): built with clang and libFuzzer into build-fuzz/.
FUZZ_TARGETS := fuzz_frame fuzz_control fuzz_reply fuzz_session
FUZZ_CC ?= clang
$(BUILD)/fuzz_frame: $(call obj,tests/fuzz/fuzz_frame.c) $(COMMON_OBJ)
	$(CC) -fsanitize=fuzzer -o $@ $^ $(LDFLAGS) $(LIBS)

$(BUILD)/fuzz_control: $(call obj,tests/fuzz/fuzz_control.c daemon/control.c daemon/pidquota.c daemon/session.c daemon/hello.c daemon/shares.c daemon/lake.c daemon/adopt.c \
                          daemon/broker.c daemon/quotas.c daemon/lakesize.c daemon/grant.c daemon/conn.c daemon/ctlsock.c daemon/listen.c daemon/fdbudget.c daemon/dispatch.c daemon/meminfo.c daemon/park.c) $(COMMON_OBJ)
	$(CC) -fsanitize=fuzzer -o $@ $^ $(LDFLAGS) -luv -lnng $(LIBS)

$(BUILD)/fuzz_session: $(call obj,tests/fuzz/fuzz_session.c daemon/session.c daemon/hello.c daemon/pidquota.c daemon/shares.c daemon/lake.c daemon/adopt.c \
                          daemon/broker.c daemon/quotas.c daemon/lakesize.c daemon/grant.c daemon/conn.c daemon/listen.c daemon/fdbudget.c daemon/dispatch.c daemon/meminfo.c daemon/park.c) $(COMMON_OBJ)
	$(CC) -fsanitize=fuzzer -o $@ $^ $(LDFLAGS) -luv $(LIBS)

$(BUILD)/fuzz_reply: $(call obj,tests/fuzz/fuzz_reply.c) $(CLIENT_OBJ) $(COMMON_OBJ)
	$(CC) -fsanitize=fuzzer -o $@ $^ $(LDFLAGS) $(LIBS)

# ThreadSanitizer build into build-tsan/ (not part of `make test`): run its tests by hand.
tsan:
	$(MAKE) BUILD=build-tsan SAN=thread all

fuzz:
	$(MAKE) BUILD=build-fuzz SAN=fuzz CC=$(FUZZ_CC) $(addprefix build-fuzz/,$(FUZZ_TARGETS))

# The seed corpora (committed): small valid inputs written by tests/fuzz/gen_corpus.c.
fuzz-corpus: $(call obj,tests/fuzz/gen_corpus.c) $(COMMON_OBJ)
	$(CC) -o $(BUILD)/gen_corpus $^ $(LDFLAGS) $(LIBS)
	mkdir -p $(addprefix tests/fuzz/corpus/,$(FUZZ_TARGETS))
	$(BUILD)/gen_corpus tests/fuzz/corpus

# Each fuzz target for FUZZ_SECONDS from its seed corpus; a crash fails.
FUZZ_SECONDS ?= 20
check-fuzz: fuzz
	tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# Rewritten whenever PREFIX, LIBDIR or the version differ from what it holds (so
# `make install PREFIX=...` installs a .pc for that prefix); the version is
# include/gmlake.h's GML_VERSION_*. Libs.private: what linking
# libgmlake-client.a statically (pkg-config --static) also needs.
VERSION := $(shell sed -n 's/^\#define GML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$$/\2/p' include/gmlake.h | paste -sd.)
$(BUILD)/gmlake.pc: FORCE
	@mkdir -p $(BUILD)
	@printf 'prefix=%s\nlibdir=%s\nincludedir=$${prefix}/include\n\nName: gmlake\nDescription: GMLake GPU memory lake client\nVersion: %s\nLicense: Apache-2.0\nLibs: -L$${libdir} -lgmlake-client\nLibs.private: -lprotobuf-c -ldl -pthread\nCflags: -I$${includedir}\n' '$(PREFIX)' '$(patsubst $(PREFIX)/%,$${prefix}/%,$(LIBDIR))' '$(VERSION)' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@ && echo "gmlake.pc: prefix $(PREFIX), version $(VERSION)"; fi
FORCE:

# common/cuda_driver.h against NVIDIA's cuda.h (not part of the build, which
# needs no CUDA package): run where CUDA's headers are, e.g. the GPU machine.
CUDA_INC ?= /usr/local/cuda/include
cuda-header-check:
	@mkdir -p $(BUILD)/gen
	$(CC) $(CFLAGS_BASE) -Icommon tools/cuda_header_check.c -o $(BUILD)/cuda_header_gen
	$(BUILD)/cuda_header_gen > $(BUILD)/gen/cuda_header_asserts.c
	$(CC) $(CFLAGS_BASE) -I$(CUDA_INC) $(BUILD)/gen/cuda_header_asserts.c -o $(BUILD)/cuda_header_asserts
	$(BUILD)/cuda_header_asserts

deps:
	@scripts/deps.sh

# Every C and C++ file of the tree to .clang-format (make test checks it).
format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cpp')

# The whole suite, plain and under ASan+UBSan (+LeakSanitizer), then the fuzz targets (tests/all.sh:
# the sanitizer and fuzz builds are made beside the plain suite). Its last line counts what passed,
# failed, was skipped and not run (tests/summary.sh).
test: deps
	@rm -f build/test-summary build-san/test-summary build-fuzz/test-summary
	@JOBS=$(JOBS) MAKE="$(MAKE)" tests/all.sh; rc=$$?; tests/summary.sh build build-san build-fuzz; exit $$rc

check-plain: all
	BUILD=$(BUILD) tests/run.sh

check-san:
	$(MAKE) BUILD=build-san SAN=1 all
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  BUILD=build-san SAN=1 tests/run.sh

# The main job: a daemon and clients doing real work (backend picked automatically); it ends with
# PASS/FAIL lines saying what it proved (exit 1 on a FAIL). make demo V=1: every line of it.
demo: deps all
	@BUILD=$(BUILD) scripts/demo.sh $(if $(V),--verbose)

# Where systemd looks (systemd.unit(5), sysusers.d(5), tmpfiles.d(5)): PREFIX=/usr (a package) puts the units in
# /lib/systemd/system (bookworm's place for a package's units, /usr/lib with merged /usr), PREFIX=/usr/local in
# /usr/local/lib/systemd/system; any other PREFIX (/opt/...), where systemd never looks, in SYSCONFDIR/systemd/system.
# The same for sysusers.d and tmpfiles.d. Each may be given (make install UNITDIR=...).
SDLIB := $(if $(filter /usr,$(PREFIX)),/usr/lib,$(if $(filter /usr/local,$(PREFIX)),/usr/local/lib,$(SYSCONFDIR)))
UNITDIR ?= $(if $(filter /usr,$(PREFIX)),/lib/systemd/system,$(if $(filter $(SYSCONFDIR),$(SDLIB)),$(SYSCONFDIR)/systemd/system,$(SDLIB)/systemd/system))
SYSUSERSDIR ?= $(SDLIB)/sysusers.d
TMPFILESDIR ?= $(SDLIB)/tmpfiles.d
UNITS := gmlaked@.service gmlake.target gmlake-instances.service
# what make install copies of python/ (the sources pip needs: no build/ or egg-info of a local build)
PY_FILES := pyproject.toml setup.py $(patsubst python/%,%,$(wildcard python/gmlake/*.py python/gmlake/*.cpp python/gmlake/*.h python/build_backend/*.py))
MAN_FILES := $(wildcard man/man1/*.1 man/man3/*.3 man/man5/*.5 man/man8/*.8)
# `man 3 FUNCTION` for every function a man 3 page names (its NAME section) but has no page of its own: a .so link
MAN3_LINKS = $(filter-out $(patsubst man/man3/%.3,%,$(wildcard man/man3/*.3)),$(shell for p in man/man3/*.3; do scripts/man-names.sh $$p; done))
# Every file make install writes, under DESTDIR (make uninstall removes these and nothing else; the config only
# while it is the example unchanged: an operator's edits stay).
INSTALLED = $(addprefix $(PREFIX)/bin/,gmlaked gmlakectl gmlake-replay) \
  $(LIBDIR)/libgmlake-client.so.1 $(LIBDIR)/libgmlake-client.so $(LIBDIR)/libgmlake-client.a \
  $(PREFIX)/include/gmlake.h $(LIBDIR)/pkgconfig/gmlake.pc $(patsubst man/%,$(MANDIR)/%,$(MAN_FILES)) \
  $(addprefix $(UNITDIR)/,$(UNITS)) $(SYSUSERSDIR)/gmlake.conf $(TMPFILESDIR)/gmlake.conf \
  $(PREFIX)/libexec/gmlake/gmlake-instances $(PREFIX)/share/gmlake/gmlaked.conf.example \
  $(addprefix $(PREFIX)/share/gmlake/python/,$(PY_FILES)) \
  $(addsuffix .3,$(addprefix $(MANDIR)/man3/,$(MAN3_LINKS))) \
  $(if $(SLURM_PLUGIN),$(PREFIX)/lib/gmlake/gmlake_spank.so $(PREFIX)/share/gmlake/plugstack.conf.example)

# Binaries, library, header, gmlake.pc, man pages, the units and a default
# config (an existing /etc/gmlake/gmlaked.conf is kept), python/'s sources, then ldconfig.
install: $(BINS) $(SLURM_PLUGIN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PREFIX)/include \
	  $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PREFIX)/share/gmlake \
	  $(sort $(dir $(patsubst man/%,$(DESTDIR)$(MANDIR)/%,$(MAN_FILES)))) $(DESTDIR)$(SYSCONFDIR)/gmlake
	install -m 755 $(BUILD)/gmlaked $(BUILD)/gmlakectl $(BUILD)/gmlake-replay $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(BUILD)/libgmlake-client.so $(DESTDIR)$(LIBDIR)/libgmlake-client.so.1
	ln -sf libgmlake-client.so.1 $(DESTDIR)$(LIBDIR)/libgmlake-client.so
	install -m 644 $(BUILD)/libgmlake-client.a $(DESTDIR)$(LIBDIR)/
	install -m 644 include/gmlake.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(BUILD)/gmlake.pc $(DESTDIR)$(LIBDIR)/pkgconfig/
	for m in $(MAN_FILES); do install -m 644 $$m $(DESTDIR)$(MANDIR)/$${m#man/}; done
	for u in $(UNITS); do \
	  sed 's|/usr/local|$(PREFIX)|g; s|/etc/gmlake|$(SYSCONFDIR)/gmlake|g' systemd/$$u > $(DESTDIR)$(UNITDIR)/$$u; done
	install -d $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(PREFIX)/libexec/gmlake
	install -m 644 systemd/gmlake.sysusers $(DESTDIR)$(SYSUSERSDIR)/gmlake.conf
	install -m 644 systemd/gmlake.tmpfiles $(DESTDIR)$(TMPFILESDIR)/gmlake.conf
	for p in man/man3/*.3; do for f in $$(scripts/man-names.sh $$p); do \
	  [ -e man/man3/$$f.3 ] || echo ".so man3/$${p##*/}" > $(DESTDIR)$(MANDIR)/man3/$$f.3; done; done
	install -m 755 scripts/gmlake-instances $(DESTDIR)$(PREFIX)/libexec/gmlake/
	# the unit's user and group, and /run/gmlake (a real install: the DESTDIR one is the package's to do)
	if [ -z "$(DESTDIR)" ] && command -v systemd-sysusers >/dev/null; then systemd-sysusers $(SYSUSERSDIR)/gmlake.conf; fi
	if [ -z "$(DESTDIR)" ] && command -v systemd-tmpfiles >/dev/null; then systemd-tmpfiles --create $(TMPFILESDIR)/gmlake.conf || true; fi
	install -m 644 systemd/gmlaked.conf.example $(DESTDIR)$(PREFIX)/share/gmlake/
	[ -e $(DESTDIR)$(SYSCONFDIR)/gmlake/gmlaked.conf ] || install -m 644 systemd/gmlaked.conf.example $(DESTDIR)$(SYSCONFDIR)/gmlake/gmlaked.conf
	for f in $(PY_FILES); do install -D -m 644 python/$$f $(DESTDIR)$(PREFIX)/share/gmlake/python/$$f; done
	if [ -n "$(SLURM_PLUGIN)" ]; then install -d $(DESTDIR)$(PREFIX)/lib/gmlake && \
	  install -m 755 $(SLURM_PLUGIN) $(DESTDIR)$(PREFIX)/lib/gmlake/gmlake_spank.so && \
	  sed 's|/usr/local|$(PREFIX)|g' slurm/plugstack.conf.example > $(DESTDIR)$(PREFIX)/share/gmlake/plugstack.conf.example; fi
	if [ -z "$(DESTDIR)" ] && command -v ldconfig >/dev/null; then ldconfig; fi

# What make install wrote (same PREFIX, DESTDIR, SYSCONFDIR): the files of INSTALLED, then the directories of
# GMLake's own that are left empty; /etc/gmlake/gmlaked.conf only while it is the example unchanged. The user
# gmlaked and group gmlake stay (files may still belong to them: sysusers.d(5) never removes either).
uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	if cmp -s systemd/gmlaked.conf.example $(DESTDIR)$(SYSCONFDIR)/gmlake/gmlaked.conf; then rm -f $(DESTDIR)$(SYSCONFDIR)/gmlake/gmlaked.conf; \
	elif [ -e $(DESTDIR)$(SYSCONFDIR)/gmlake/gmlaked.conf ]; then echo "kept $(SYSCONFDIR)/gmlake/gmlaked.conf: edited since make install"; fi
	for dir in $(PREFIX)/share/gmlake/python/gmlake $(PREFIX)/share/gmlake/python/build_backend $(PREFIX)/share/gmlake/python \
	  $(PREFIX)/share/gmlake $(PREFIX)/libexec/gmlake $(PREFIX)/lib/gmlake $(SYSCONFDIR)/gmlake; do \
	  [ ! -d $(DESTDIR)$$dir ] || rmdir --ignore-fail-on-non-empty $(DESTDIR)$$dir; done
	if [ -z "$(DESTDIR)" ] && command -v ldconfig >/dev/null; then ldconfig; fi

# python/ as a wheel in $(BUILD)/dist (pip wheel, offline; the extension where torch is importable by PYTHON).
PYTHON ?= python3
wheel: $(BUILD)/libgmlake-client.so
	rm -rf $(BUILD)/wheel && mkdir -p $(BUILD)/wheel/prefix/lib $(BUILD)/dist
	for f in $(PY_FILES); do install -D -m 644 python/$$f $(BUILD)/wheel/src/$$f; done
	ln -s $(CURDIR)/include $(BUILD)/wheel/prefix/include && ln -s $(CURDIR)/$(BUILD)/libgmlake-client.so $(BUILD)/wheel/prefix/lib/
	GMLAKE_PREFIX=$(CURDIR)/$(BUILD)/wheel/prefix $(PYTHON) -m pip wheel --no-deps --no-index --no-cache-dir -w $(BUILD)/dist $(BUILD)/wheel/src
	@ls $(BUILD)/dist/gmlake-$(VERSION)-*.whl

# Debian packages (debian/): gmlaked, libgmlake-client1, libgmlake-client-dev, then lintian. They land in
# $(BUILD)/deb. Installs debhelper, lintian and fakeroot when missing (scripts/deps.sh deb).
deb:
	@scripts/deps.sh deb
	scripts/build-deb.sh $(BUILD)/deb

clean:
	rm -rf build build-san build-fuzz build-tsan
