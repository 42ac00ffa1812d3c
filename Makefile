# Every target installs what it needs into .venv first (Python >= 3.11, pip, no GPU needed).
PYTHON ?= python3
# The torch release to install: the newest installable here (CI's); 2.13.0 is tested too (make test TORCH=2.13.0).
TORCH  ?= 2.14.1
VENV   ?= .venv
BIN     = $(VENV)/bin
OUT    ?= capture-out
GRAPH  ?= graph.parquet
REPLAY ?= replay-out

.PHONY: install demo test test-fast lint results results-programs results-programs-floor results-programs-accumulate results-program-layers results-torchtitan results-torchtitan-mesh results-torchtitan-floor results-torchtitan-4d results-mesh results-moe-skew results-scale-mesh results-random results-call-cost results-host-work-gil results-from-traces fetch-traces results-ddp-overlap results-pipeline-p2p results-collective-prices results-seeds results-families fidelity respec gpu-checks figures clean

install: $(VENV)/.installed-torch-$(TORCH)

$(VENV)/.installed-torch-$(TORCH): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: an open range would pull whatever build is newest.
	$(BIN)/pip install -q torch==$(TORCH)
	$(BIN)/pip install -q -e '.[test]'
	rm -f $(VENV)/.installed*
	touch $@

demo: install   ## capture the default slice (tiny GPT, target tp=8 pp=16 dp=64), build its full-scale graph, replay rank 123
	# 12 warm-up iterations: the noise that the collectives' skew grows with rests on 10 clean ones.
	$(BIN)/prism-capture -o $(OUT) --overwrite --warmup 12
	$(BIN)/prism-build-graph $(OUT) --tp 8 --pp 16 --dp 64 -o $(GRAPH)
	$(BIN)/prism-replay $(GRAPH) --rank 123 -o $(REPLAY) --overwrite --warmup 12

# Two workers, a test module each at a time (its shared captures made once): most tests run one
# process at a time, so two of them keep CI's two cores busy.
test: install   ## the whole suite, as CI runs it
	$(BIN)/python -m pytest -q -n 2 --dist loadscope --durations=40

figures: install   ## run the notebooks; their figures go to docs/figures (the README shows them)
	$(BIN)/python notebooks/execute.py --figures docs/figures notebooks/pipeline_iteration.py notebooks/replay.py notebooks/what_ifs.py \
	    notebooks/gpu_trace.py

test-fast: install   ## unit tests only
	$(BIN)/python -m pytest -q tests/unit

# Every figure the README and docs quote, measured again into benchmarks/results/ (about 90 min on
# a 2-core CPU). Run it on a quiet machine: the benchmarks time real work. benchmarks/README.md
# lists every script with its target.
RECORD = $(BIN)/python benchmarks/record.py
results: install
	$(RECORD) demo -- $(MAKE) --no-print-directory demo
	$(RECORD) replay_overhead -- $(BIN)/python benchmarks/replay_overhead.py $(GRAPH) --rank 123 --repeats 3
	$(RECORD) cosim_cost -- $(BIN)/python benchmarks/cosim_cost.py $(GRAPH) --rank 123
	$(RECORD) simulate_speed -- $(BIN)/python benchmarks/simulate_speed.py --dp 8 64 --repeats 3
	$(RECORD) build_graph -- $(BIN)/python benchmarks/build_graph.py --dp 64 --repeats 3
	$(RECORD) scale -- $(BIN)/python benchmarks/scale.py --capture $(OUT)
	$(BIN)/prism-build-graph $(OUT) --tp 8 --pp 16 --dp 1024 --no-simulate -o graph-131072.parquet
	$(RECORD) replay_overhead_131072 -- $(BIN)/python benchmarks/replay_overhead.py graph-131072.parquet --rank 123 --repeats 3
	$(RECORD) graph_io -- $(BIN)/python benchmarks/graph_io.py
	$(RECORD) capture_cost -- $(BIN)/python benchmarks/capture_cost.py --repeats 3
	$(RECORD) gpu_trace_timeline -- $(BIN)/python benchmarks/gpu_trace_timeline.py
	$(RECORD) overlap_calls -- $(BIN)/python benchmarks/overlap_calls.py --json benchmarks/results/overlap_calls.json
	$(RECORD) fidelity -- $(BIN)/python benchmarks/fidelity.py --repeats 5 --warmup 16 --paced --recalibrate \
	    --calibrate-into benchmarks/results/fidelity-spec.toml --calibrate-reps 100 \
	    --calibrate-wake-gaps-ms 0.25,0.5,1,2,4,8,16,32 --json benchmarks/results/fidelity.json --work-dir $$(mktemp -d)/fidelity
	$(MAKE) --no-print-directory results-programs
	$(MAKE) --no-print-directory results-random
	$(MAKE) --no-print-directory results-moe-skew
	$(MAKE) --no-print-directory results-call-cost results-host-work-gil results-from-traces

# benchmarks/scale.py on a 5-axis mesh: torchtitan's llama3 at pp 2 x HSDP (R replicas x 128 shards)
# x cp 2 x tp 2, R = 2, 8, 32, 128 (2,048 to 131,072 ranks), each world captured first (about 25 min).
SCALE_MESH_DIR ?= $(CURDIR)/scale-mesh-work
SCALE_MESH_R = 2 8 32 128
TT_5D = --pp 2 --dp-shard 128 --cp 2 --tp 2
TT_5D_PROGRAM = $(subst seq_len 128,seq_len 256,$(TT_PROGRAM)) --parallelism.pipeline_parallel_degree 2 \
    --parallelism.data_parallel_shard_degree 128 --parallelism.context_parallel_degree 2 \
    --parallelism.tensor_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B
results-scale-mesh: install
	$(TT_ASSETS)
	rm -rf $(SCALE_MESH_DIR) && mkdir -p $(SCALE_MESH_DIR)
	$(foreach r,$(SCALE_MESH_R),cd $(TT_DIR) && $(CURDIR)/$(BIN)/prism-capture $(TT_5D) --dp-replicate $(r) --warmup 4 \
	    --iterations 2 -o $(SCALE_MESH_DIR)/r$(r) -- $(TT_5D_PROGRAM) --parallelism.data_parallel_replicate_degree $(r) >/dev/null &&) true
	$(TT_FIDELITY) scale_mesh -- $(CURDIR)/$(BIN)/python $(CURDIR)/benchmarks/scale.py --replay-rank 123 \
	    --program-captures $(foreach r,$(SCALE_MESH_R),$(SCALE_MESH_DIR)/r$(r))

# The routing-skew what-if on examples/moe.py captured at dp 64 with ep 16: the predicted iteration
# as built and at Zipf exponents 0, 0.5, 1 and 2 (under a minute).
MOE_DIR ?= $(CURDIR)/moe-skew-work
MOE_LAYOUT = --dp 64 --ep 16
results-moe-skew: install
	rm -rf $(MOE_DIR) && mkdir -p $(MOE_DIR)
	COLUMNS=200 $(RECORD) moe_skew -- sh -c 'cd $(MOE_DIR) && \
	    $(CURDIR)/$(BIN)/prism-capture $(MOE_LAYOUT) --warmup 4 --iterations 2 -o cap -- \
	        $(CURDIR)/examples/moe.py --ep 16 --steps 50 --hidden 32 --vocab 64 >/dev/null 2>&1 && \
	    $(CURDIR)/$(BIN)/prism-build-graph cap $(MOE_LAYOUT) -o g.parquet 2>&1 | grep "job iteration" && \
	    for s in 0 0.5 1 2; do $(CURDIR)/$(BIN)/prism-simulate g.parquet --moe-skew $$s -o s.json 2>&1 | grep "^what-if"; done'

# Ten cases drawn at random (a seed not used while developing: 2026, 1127, 31, 515, 4242, 8675, 60221, 31337, 20261127, 112711, 271828, 161803, 141421, 577215, 662607, 314159, 246810, 8128, 1729, 90210, 4747, 7919, 65537, 299792, 173205 and 1618033 are used),
# priced with the spec the fixed cases calibrated (about 15 min).
SEED ?= 31
results-random: install
	$(RECORD) fidelity_random -- $(BIN)/python benchmarks/fidelity.py --random 10 --seed $(SEED) --repeats 3 --warmup 12 \
	    --cluster-spec benchmarks/results/fidelity-spec.toml --json benchmarks/results/fidelity_random.json

# Each example program against its own torchrun run (world 2), one layout per command (about 60 min).
# Eight interleaved repeats: with five, the real side's own standard error (2.3-9.5 % on this VM,
# 5.5 % on average) was above the 3 % the replay is judged by.
FIDELITY_PROGRAMS = $(BIN)/python benchmarks/fidelity.py --repeats 8 --warmup 12
PROGRAM_SPEC = benchmarks/results/fidelity-programs-spec.toml
results-programs: install
	$(RECORD) fidelity_programs_dp -- $(FIDELITY_PROGRAMS) --dp 2 --recalibrate --calibrate-into $(PROGRAM_SPEC) \
	    --calibrate-reps 30 --calibrate-busy-rounds 30 \
	    --calibrate-wake-gaps-ms 0.25,0.5,1,2,4,8,16,32 --json benchmarks/results/fidelity_programs_dp.json \
	    --program "examples/ddp.py --steps 40" --program "examples/fsdp2.py --steps 40" \
	    --program "examples/hf_gpt2_ddp.py --steps 40" --program "examples/compile_ddp.py --steps 40"
	$(RECORD) fidelity_programs_dp_larger -- $(FIDELITY_PROGRAMS) --dp 2 --cluster-spec $(PROGRAM_SPEC) \
	    --json benchmarks/results/fidelity_programs_dp_larger.json \
	    --program "examples/compile_ddp.py --steps 40 --hidden 256 --layers 4 --vocab 1024 --seq 64" \
	    --program "examples/hf_gpt2_ddp.py --steps 40 --layers 4 --hidden 256 --heads 8"
	$(RECORD) fidelity_programs_pp -- $(FIDELITY_PROGRAMS) --pp 2 --cluster-spec $(PROGRAM_SPEC) \
	    --json benchmarks/results/fidelity_programs_pp.json \
	    --program "examples/pp.py --pp 2 --schedule GPipe --steps 40" --program "examples/pp.py --pp 2 --schedule 1F1B --steps 40" \
	    --program "examples/pp.py --pp 2 --schedule Interleaved1F1B --steps 40" \
	    --program "examples/pp.py --pp 2 --schedule ZBVZeroBubble --steps 40"
	$(RECORD) fidelity_programs_tp -- $(FIDELITY_PROGRAMS) --tp 2 --cluster-spec $(PROGRAM_SPEC) \
	    --json benchmarks/results/fidelity_programs_tp.json --program "examples/tp_fsdp.py --tp 2 --steps 40"

# A program built at another layer count than captured (prism-build-graph --layers): examples/fsdp2.py
# and Hugging Face's GPT-2 under DDP at 10 layers, captured with 5 and built at 10, then each
# captured at 10 (about 12 min).
LAYERS_PROGRAM = examples/fsdp2.py --hidden 128 --steps 3000
LAYERS_DDP = examples/hf_gpt2_ddp.py --hidden 128 --steps 3000
LAYERS_RUN = $(BIN)/python benchmarks/fidelity.py --dp 2 --repeats 3 --warmup 12 --window-s 3 --cluster-spec $(PROGRAM_SPEC)
results-program-layers: install
	$(RECORD) fidelity_program_layers_built -- $(LAYERS_RUN) --program "$(LAYERS_PROGRAM) --layers 10" \
	    --capture-program "$(LAYERS_PROGRAM) --layers 5" --build-layers 10 \
	    --json benchmarks/results/fidelity_program_layers_built.json
	$(RECORD) fidelity_program_layers_captured -- $(LAYERS_RUN) --program "$(LAYERS_PROGRAM) --layers 10" \
	    --json benchmarks/results/fidelity_program_layers_captured.json
	$(RECORD) fidelity_program_layers_ddp_built -- $(LAYERS_RUN) --program "$(LAYERS_DDP) --layers 10" \
	    --capture-program "$(LAYERS_DDP) --layers 5" --build-layers 10 \
	    --json benchmarks/results/fidelity_program_layers_ddp_built.json
	$(RECORD) fidelity_program_layers_ddp_captured -- $(LAYERS_RUN) --program "$(LAYERS_DDP) --layers 10" \
	    --json benchmarks/results/fidelity_program_layers_ddp_captured.json

# Programs that accumulate gradients over microbatches, each against its own torchrun run and
# then its noise floor, eight repeats: DDP under no_sync with small buckets, and a Hugging Face
# Llama in FSDP2 (clipping, a cosine schedule) alone and with tensor parallelism inside
# (about 30 min; the spec recalibrated first).
ACCUMULATE_SPEC = benchmarks/results/fidelity-accumulate-spec.toml
ACCUMULATE_DP = --program "examples/ddp.py --steps 40 --accumulate 3 --bucket-cap-mb 1" --program "examples/hf_llama.py --steps 30"
ACCUMULATE_TP = --program "examples/hf_llama.py --tp 2 --steps 30"
results-programs-accumulate: install
	$(RECORD) fidelity_accumulate_dp -- $(FIDELITY_PROGRAMS) --dp 2 --recalibrate --calibrate-into $(ACCUMULATE_SPEC) \
	    --calibrate-reps 30 --calibrate-busy-rounds 30 \
	    --calibrate-wake-gaps-ms 0.25,0.5,1,2,4,8,16,32 --json benchmarks/results/fidelity_accumulate_dp.json $(ACCUMULATE_DP)
	$(RECORD) fidelity_accumulate_tp -- $(FIDELITY_PROGRAMS) --tp 2 --cluster-spec $(ACCUMULATE_SPEC) \
	    --json benchmarks/results/fidelity_accumulate_tp.json $(ACCUMULATE_TP)
	$(RECORD) noise_floor_accumulate_dp -- $(FLOOR_PROGRAMS) --dp 2 --against benchmarks/results/fidelity_accumulate_dp.json \
	    --json benchmarks/results/noise_floor_accumulate_dp.json $(ACCUMULATE_DP)
	$(RECORD) noise_floor_accumulate_tp -- $(FLOOR_PROGRAMS) --tp 2 --against benchmarks/results/fidelity_accumulate_tp.json \
	    --json benchmarks/results/noise_floor_accumulate_tp.json $(ACCUMULATE_TP)

# torchtitan, unmodified, against its own torchrun runs at world 2: three interleaved repeats a case,
# in a folder holding the synthetic tokenizer and data its debug configuration reads (TT_DIR). Each
# case is a layout and the program with torchtitan's same degrees.
TT_DIR ?= $(CURDIR)/torchtitan-work
TT_PROGRAM = -m torchtitan.train --module llama3 --config llama3_debugmodel --training.seq_len 128 \
    --training.local_batch_size 2 --training.steps 30 --metrics.log_freq 1000 --training.disable_cuda_graphs
TT_DEEPSEEK = $(subst --module llama3 --config llama3_debugmodel,--module deepseek_v3 --config deepseek_v3_debugmodel,$(TT_PROGRAM))
TT_ONE_SHARD = --parallelism.data_parallel_shard_degree 1
TT_CASE_dp = --dp 2 --program "$(TT_PROGRAM) --parallelism.data_parallel_shard_degree 2"
TT_CASE_tp = --tp 2 --program "$(TT_PROGRAM) --parallelism.tensor_parallel_degree 2 $(TT_ONE_SHARD)"
TT_CASE_pp = --pp 2 --program "$(TT_PROGRAM) --parallelism.pipeline_parallel_degree 2 \
    --parallelism.pipeline_parallel_schedule 1F1B $(TT_ONE_SHARD)"
# context parallel cuts the sequence into 2 x cp blocks of FlexAttention's 128 tokens
TT_CASE_cp = --cp 2 --program "$(subst seq_len 128,seq_len 256,$(TT_PROGRAM)) --parallelism.context_parallel_degree 2 $(TT_ONE_SHARD)"
TT_CASE_ep = --dp 2 --ep 2 --program "$(TT_DEEPSEEK) --parallelism.data_parallel_shard_degree 2 --parallelism.expert_parallel_degree 2"
TT_FIDELITY = cd $(TT_DIR) && $(CURDIR)/$(BIN)/python $(CURDIR)/benchmarks/record.py
TT_RUN = $(CURDIR)/$(BIN)/python $(CURDIR)/benchmarks/fidelity.py --repeats 3 --warmup 8 \
    --cluster-spec $(CURDIR)/$(PROGRAM_SPEC)
TT_RESULTS = $(CURDIR)/benchmarks/results
TT_ASSETS = $(BIN)/python tests/data/torchtitan/make_assets.py $(TT_DIR)

# llama3's debug model with FSDP2, tensor parallel and pipelining (1F1B) (about 25 min).
results-torchtitan: install
	$(TT_ASSETS)
	$(foreach c,dp tp pp,$(TT_FIDELITY) fidelity_torchtitan_$(c) -- $(TT_RUN) $(TT_CASE_$(c)) \
	    --json $(TT_RESULTS)/fidelity_torchtitan_$(c).json &&) true

# On a mesh (about 12 min): llama3 with context parallel and DeepSeek-V3's debug mixture of experts
# with expert parallel 2 over dp_shard 2 (priced by the spec that times all-to-alls).
results-torchtitan-mesh: install
	$(TT_ASSETS)
	$(TT_FIDELITY) fidelity_torchtitan_cp -- $(TT_RUN) $(TT_CASE_cp) --json $(TT_RESULTS)/fidelity_torchtitan_cp.json
	$(TT_FIDELITY) fidelity_torchtitan_ep -- $(TT_RUN) --cluster-spec $(CURDIR)/$(MESH_SPEC) $(TT_CASE_ep) \
	    --json $(TT_RESULTS)/fidelity_torchtitan_ep.json

# Four dimensions at world 8 (about 16 min, nothing else running): DeepSeek-V3's debug mixture of
# experts with pipelining (1F1B), FSDP, tensor parallel and expert parallel 2 over tp, one repeat of
# 3 warm-up iterations, the simulation alone (each iteration takes about 30 s: eight ranks on this
# machine's two cores; a replay adds about 20 min).
TT_CASE_4d = --pp 2 --dp 2 --tp 2 --ep 2 --program "$(subst steps 30,steps 12,$(TT_DEEPSEEK)) \
    --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B \
    --parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --parallelism.expert_parallel_degree 2"
results-torchtitan-4d: install
	$(TT_ASSETS)
	$(TT_FIDELITY) fidelity_torchtitan_4d -- $(CURDIR)/$(BIN)/python $(CURDIR)/benchmarks/fidelity.py --repeats 1 --warmup 3 \
	    --no-replay --cluster-spec $(CURDIR)/$(MESH_SPEC) $(TT_CASE_4d) --json $(TT_RESULTS)/fidelity_torchtitan_4d.json

# The noise floor of every torchtitan case: its real run against a second real run, three repeats,
# beside the latest fidelity records (about 30 min).
TT_FLOOR = $(CURDIR)/$(BIN)/python $(CURDIR)/benchmarks/noise_floor.py --repeats 3 --warmup 8
results-torchtitan-floor: install
	$(TT_ASSETS)
	$(foreach c,dp tp pp cp ep,$(TT_FIDELITY) noise_floor_torchtitan_$(c) -- $(TT_FLOOR) $(TT_CASE_$(c)) \
	    --against $(TT_RESULTS)/fidelity_torchtitan_$(c).json --json $(TT_RESULTS)/noise_floor_torchtitan_$(c).json &&) true

# Programs on a mesh against their own torchrun runs: the mixture of experts at ep 2 and context
# parallel attention at cp 2 (world 2), HSDP at 2 replicas x 2 shards (world 4), with a spec calibrated here that
# prices all-to-alls, each beside its noise floor (about 50 min). The mixture of experts' 24 ms iterations are
# measured over 3 s windows.
MESH_SPEC = benchmarks/results/fidelity-mesh-spec.toml
results-mesh: install
	$(RECORD) fidelity_mesh_moe -- $(FIDELITY_PROGRAMS) --dp 2 --ep 2 --recalibrate --calibrate-into $(MESH_SPEC) \
	    --calibrate-reps 30 --calibrate-busy-rounds 30 \
	    --calibrate-wake-gaps-ms 0.25,0.5,1,2,4,8,16,32 --json benchmarks/results/fidelity_mesh_moe.json \
	    --window-s 3 --program "examples/moe.py --ep 2 --steps 400"
	$(RECORD) fidelity_mesh_cp -- $(FIDELITY_PROGRAMS) --cp 2 --cluster-spec $(MESH_SPEC) \
	    --json benchmarks/results/fidelity_mesh_cp.json --program "examples/cp.py --cp 2 --steps 40"
	$(RECORD) noise_floor_mesh_cp -- $(FLOOR_PROGRAMS) --cp 2 --against benchmarks/results/fidelity_mesh_cp.json \
	    --json benchmarks/results/noise_floor_mesh_cp.json --program "examples/cp.py --cp 2 --steps 40"
	$(RECORD) noise_floor_mesh_moe -- $(FLOOR_PROGRAMS) --dp 2 --ep 2 --against benchmarks/results/fidelity_mesh_moe.json \
	    --json benchmarks/results/noise_floor_mesh_moe.json --window-s 3 --program "examples/moe.py --ep 2 --steps 400"
	$(RECORD) fidelity_mesh_hsdp -- $(FIDELITY_PROGRAMS) --dp-replicate 2 --dp-shard 2 --cluster-spec $(MESH_SPEC) \
	    --json benchmarks/results/fidelity_mesh_hsdp.json --program "examples/fsdp2.py --replicate 2 --steps 400"
	$(RECORD) noise_floor_mesh_hsdp -- $(FLOOR_PROGRAMS) --dp-replicate 2 --dp-shard 2 \
	    --against benchmarks/results/fidelity_mesh_hsdp.json --json benchmarks/results/noise_floor_mesh_hsdp.json \
	    --program "examples/fsdp2.py --replicate 2 --steps 400"

# The noise floor of results-programs: each program's real run against a second real run of it
# where the replay stands, eight repeats, beside the latest records (about 25 min).
FLOOR_PROGRAMS = $(BIN)/python benchmarks/noise_floor.py --repeats 8 --warmup 12
results-programs-floor: install
	$(RECORD) noise_floor_programs_dp -- $(FLOOR_PROGRAMS) --dp 2 --against benchmarks/results/fidelity_programs_dp.json \
	    --json benchmarks/results/noise_floor_programs_dp.json \
	    --program "examples/ddp.py --steps 40" --program "examples/fsdp2.py --steps 40" \
	    --program "examples/hf_gpt2_ddp.py --steps 40" --program "examples/compile_ddp.py --steps 40"
	$(RECORD) noise_floor_programs_dp_larger -- $(FLOOR_PROGRAMS) --dp 2 --against benchmarks/results/fidelity_programs_dp_larger.json \
	    --json benchmarks/results/noise_floor_programs_dp_larger.json \
	    --program "examples/compile_ddp.py --steps 40 --hidden 256 --layers 4 --vocab 1024 --seq 64" \
	    --program "examples/hf_gpt2_ddp.py --steps 40 --layers 4 --hidden 256 --heads 8"
	$(RECORD) noise_floor_programs_pp -- $(FLOOR_PROGRAMS) --pp 2 --against benchmarks/results/fidelity_programs_pp.json \
	    --json benchmarks/results/noise_floor_programs_pp.json \
	    --program "examples/pp.py --pp 2 --schedule GPipe --steps 40" --program "examples/pp.py --pp 2 --schedule 1F1B --steps 40" \
	    --program "examples/pp.py --pp 2 --schedule Interleaved1F1B --steps 40" \
	    --program "examples/pp.py --pp 2 --schedule ZBVZeroBubble --steps 40"
	$(RECORD) noise_floor_programs_tp -- $(FLOOR_PROGRAMS) --tp 2 --against benchmarks/results/fidelity_programs_tp.json \
	    --json benchmarks/results/noise_floor_programs_tp.json --program "examples/tp_fsdp.py --tp 2 --steps 40"

# What a virtual call costs the program (docs/replay.md): the process group's whole call, and the
# replay clock's own part of it (under a minute).
results-call-cost: install
	$(RECORD) call_cost -- $(BIN)/python benchmarks/call_cost.py
	$(RECORD) clock_cost -- $(BIN)/python benchmarks/clock_cost.py

# The host work of virtual collectives beside a program's thread, as a Python loop and compiled
# (docs/replay.md; about 3 min).
results-host-work-gil: install
	$(RECORD) host_work_gil -- $(BIN)/python benchmarks/host_work_gil.py

# Graphs built from the public GPU traces of tests/data/gpu_traces, and those fetch-traces brought,
# against the traces' own steps (docs/gpu-traces.md; about 2 min).
results-from-traces: install
	$(RECORD) from_traces -- $(BIN)/python benchmarks/from_traces.py

# The public GPU traces too large for tests/data (benchmarks/public_traces.toml), each checked
# against its git blob id, into benchmarks/traces/ (needs the network).
fetch-traces: install
	$(BIN)/python benchmarks/fetch_traces.py

# What real gradient all-reduces cost a small DDP step beside its compute: alone, two processes,
# two DDP ranks over gloo (about 1 min).
results-ddp-overlap: install
	$(RECORD) ddp_overlap -- $(BIN)/python benchmarks/ddp_overlap.py

# Where each schedule of examples/pp.py spends its transfers, every rank real under plain torchrun
# (about 1 min).
PP_SCHEDULES = GPipe 1F1B Interleaved1F1B ZBVZeroBubble
results-pipeline-p2p: install
	$(foreach s,$(PP_SCHEDULES),$(RECORD) pipeline_p2p_$(s) -- $(BIN)/python benchmarks/pipeline_p2p.py \
	    --json benchmarks/results/pipeline_p2p_$(s).json -- examples/pp.py --pp 2 --schedule $(s) --steps 40 &&) true

# A program's real collectives beside its graph's prices: examples/hf_llama.py at tp 2, three pairs
# of captures one after the other (every rank real; a slice holding its calls), each slice built and
# priced with the accumulate run's spec (about 5 min).
PRICES_DIR ?= $(CURDIR)/collective-prices-work
PRICES_LAYOUT = --tp 2 --pp 1 --dp 1
PRICES_PROGRAM = examples/hf_llama.py --tp 2 --steps 30
results-collective-prices: install
	rm -rf $(PRICES_DIR) && mkdir -p $(PRICES_DIR)
	$(foreach i,1 2 3,$(BIN)/prism-capture $(PRICES_LAYOUT) --real all --warmup 12 --iterations 2 \
	        -o $(PRICES_DIR)/real$(i) -- $(PRICES_PROGRAM) >/dev/null && \
	    $(BIN)/prism-capture $(PRICES_LAYOUT) --host-work $(ACCUMULATE_SPEC) --hold-calls $(ACCUMULATE_SPEC) \
	        --warmup 12 --iterations 2 -o $(PRICES_DIR)/slice$(i) -- $(PRICES_PROGRAM) >/dev/null && \
	    $(BIN)/prism-build-graph $(PRICES_DIR)/slice$(i) $(PRICES_LAYOUT) --cluster $(ACCUMULATE_SPEC) \
	        -o $(PRICES_DIR)/graph$(i).parquet >/dev/null && \
	    $(RECORD) collective_prices_hf_llama_tp_$(i) -- $(BIN)/python benchmarks/collective_prices.py \
	        $(PRICES_DIR)/real$(i) $(PRICES_DIR)/graph$(i).parquet \
	        --json benchmarks/results/collective_prices_hf_llama_tp_$(i).json &&) true

# Every random seed's kept run, one line a seed (docs/fidelity.md's table), and their signed errors
# pooled by kind of rank (seconds: it reads benchmarks/results/fidelity_random*.json).
results-seeds: install
	$(RECORD) fidelity_seeds -- $(BIN)/python benchmarks/fidelity_seeds.py --markdown
	$(RECORD) fidelity_seeds_bias -- $(BIN)/python benchmarks/fidelity_seeds.py --bias

# Every kept fidelity record pooled by family and source, judged by bias and floor; SINCE=DATE
# pools one code version's runs (seconds).
SINCE ?=
results-families: install
	$(RECORD) fidelity_families -- $(BIN)/python benchmarks/fidelity_families.py $(if $(SINCE),--since $(SINCE))

# The fidelity protocol on a seed never used, make fidelity SEED=S (benchmarks/fidelity_seeds.py --used lists
# the used ones, the default SEED among them): CASES random
# world-2 GPT cases at one repeat, every run's median over 3 s of iterations and repeated past 2 % steal, priced
# by the committed spec as a user's one calibration prices them; then their noise floor, each seed's run in its
# own results files; then the families table of every seed's run pooled (each a fresh draw), written into
# docs/fidelity.md. A case costs about 1.1 min and its floor 0.5 min: CASES=30 about 50 min. The slices stay in
# FIDELITY_WORK/SEED (120 MB a case), so that make respec re-prices the same run (the real side unchanged).
CASES ?= 30
FIDELITY_WORK ?= fidelity-work
fidelity: install
	@$(BIN)/python benchmarks/fidelity_seeds.py --unused $(SEED)
	$(RECORD) fidelity_protocol_$(SEED) -- $(BIN)/python benchmarks/fidelity.py --random $(CASES) --seed $(SEED) --repeats 1 \
	    --warmup 12 --window-s 3 --cluster-spec benchmarks/results/fidelity-spec.toml \
	    --work-dir $(FIDELITY_WORK)/$(SEED) --json benchmarks/results/fidelity_protocol_$(SEED).json
	$(RECORD) noise_floor_protocol_$(SEED) -- $(BIN)/python benchmarks/noise_floor.py --random $(CASES) --seed $(SEED) \
	    --repeats 1 --warmup 12 --window-s 3 --against benchmarks/results/fidelity_protocol_$(SEED).json \
	    --json benchmarks/results/noise_floor_protocol_$(SEED).json
	$(BIN)/python benchmarks/fidelity_families.py --files benchmarks/results/fidelity_protocol_*.json \
	    benchmarks/results/noise_floor_protocol_*.json --docs docs/fidelity.md

# A kept fidelity run (its --json and --work-dir) re-priced under other specs, the real side and
# slices unchanged: make respec RUN=run.json WORK_DIR=DIR SPECS="old=a.toml new=b.toml" (prints);
# RESPEC_ARGS="--without busy_call --also run2.json=DIR2 --floor floor.json" switches a mechanism
# off, pools another run and gives the families' floors.
respec: install
	@test -n "$(RUN)" && test -n "$(WORK_DIR)" && test -n "$(SPECS)" || \
	    { echo "usage: make respec RUN=RUN.json WORK_DIR=DIR SPECS='NAME=SPEC.toml ...' [RESPEC_ARGS=...]"; exit 2; }
	$(BIN)/python benchmarks/fidelity_respec.py $(RUN) $(WORK_DIR) $(SPECS) $(RESPEC_ARGS)

# On a GPU host: every check that needs a GPU (benchmarks/gpu_checks.sh, docs/gpu-traces.md), its
# logs and results into GPU_OUT (kept as benchmarks/results/gpu_<device>_<date>/).
GPU_OUT ?= gpu-checks
gpu-checks: install
	PY=$(CURDIR)/$(BIN)/python bash benchmarks/gpu_checks.sh $(GPU_OUT)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) $(OUT) $(GRAPH) $(REPLAY) .pytest_cache .ruff_cache .hypothesis
