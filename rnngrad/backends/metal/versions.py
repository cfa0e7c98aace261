"""Which kernel version runs each Metal dispatch, and why: the one place the host chooses.

The recurrences (``kernels/<cell>_{forward,backward}.metal``) have three versions, v2 in two
grids:

- ``v1`` ``<cell>_<direction>``: a thread per (row, unit), each a dot product of length H per
  gate straight from device memory, run in one of two grids: ``packed`` (``count = D·N·H``
  threads, so threadgroups of up to 1024 threads each own as many whole rows as fit) or
  ``rows`` (``count = D·N·1024``, one threadgroup per row, its threads striding over the
  units). v1's grid rule: **rows when H ≤** :data:`ROWS_MAX_H` **and packing leaves fewer
  than** :data:`ROWS_MIN_GROUPS` **threadgroups, else packed** (always packed on the CPU
  harness, where every idle thread is a fiber).
- ``v2`` ``<cell>_<direction>_v2``: each step's recurrent product as a small matrix product
  over a chunk of at most :data:`V2_ROWS` rows, the chunk's left factor staged in threadgroup
  memory, each thread one unit of every row of the chunk and a slice of the reduction, the
  slices' sums met by SIMD shuffles (kernels/common.metal). ``count`` = one threadgroup of
  :data:`V2_THREADS` per :data:`V2_GROUP_ROWS` rows (kernels accept any count: a threadgroup
  takes its rows in chunks).
- ``v2-steps``: v2's kernels in a second grid, one dispatch per step: each group of
  :data:`V2_STEP_ROWS` rows (default a whole chunk) gets ⌈H / :data:`V2_STEP_UNITS`⌉
  threadgroups, each a block of the units, so that a step's product spreads over many cores
  and each element of R loaded serves every row of the group (:func:`step_blocks`). The
  backward moves each step's dA·R to the start of the next dispatch, which reads dA of every
  unit back from memory (T + 1 dispatches). A GRU without reset_after (its step reads r, and
  backward da_o, of every unit) follows the rule. Only when forced.
- ``v3`` ``<cell>_<direction>_v3``: one dispatch per step too, each threadgroup of
  :data:`V3_THREADS` a tile of up to :data:`V3_ROWS` rows of one direction × a block of units,
  whose recurrent product is a register-blocked matrix product (4×4 a thread, k split over the
  threads left) with both factors staged through threadgroup memory, the cell's element-wise
  work its epilogue (:func:`tile_blocks` picks the width; T + 1 dispatches backward, as
  v2-steps). Each chunk of K is staged with a thread's loads issued before its stores and the
  next chunk's loads in flight during the product (``rs_product``, kernels/common.metal). A
  GRU without reset_after follows the rule.

The rule (``auto``): **v3 where a step's recurrent product D·N·G·H² has at least**
:data:`STEPS_MIN_WORK` **(2**25) multiply-adds (a GRU only with reset_after); else v2, one
row a threadgroup, where H is in the cell's and direction's range** (:data:`V2_H`) **and D·N
≤** :data:`V2_MAX_ROWS` **(a GRU only with reset_after); else v1 in its grid** (v1 packed on
the CPU harness). v2 reads R and the staged
left factor as float4 where H allows (``rg_dots``, kernels/common.metal): the lanes of a unit
then read whole 128-byte lines of a weight row. Device ms (torch.profiler) of the forward /
backward recurrences through metal-cuda, v1 (its grid) → v2 (one row a threadgroup, float4
reads, the cells' loads before their stores, the next step's stage left in threadgroup
memory), on an H200 (2026-11-26; runs on an H100 the day before ranked them the same way):

- 100×32×256×256: RNN 1.29 / 0.62 → 0.54 / 0.57; GRU 1.95 / 2.28 → 1.08 / 1.39; LSTM
  2.56 / 2.34 → 1.32 / 1.81.
- 1000×8×128×128: RNN 2.53 / 2.32 → 2.17 / 2.50; GRU 7.85 / 8.41 → 4.98 / 5.57; LSTM
  12.97 / 12.55 → 5.22 / 7.63.
- 50×1×64×64: RNN 0.083 / 0.087 → 0.094 / 0.108; GRU 0.146 / 0.234 → 0.179 / 0.195; LSTM
  0.199 / 0.261 → 0.197 / 0.215 (v2 for the GRU's and LSTM's backward only).
- 200×64×512×512: RNN 5.79 / 2.88 → 4.20 / 4.30; GRU 9.28 / 10.41 → 11.21 / 12.20; LSTM
  11.38 / 10.70 → 14.49 / 16.06 (v2 for the single-gate forward only).

v2's step then spent most of its instructions on work besides the product: Nsight Compute counted
about 800 instructions a SIMD-group a step at 50×1 (the LSTM's forward), of which the
multiply-adds' loop was a quarter; the rest zeroed and shuffled partial sums for eight rows where
the threadgroup had one, divided by N for row indices, loaded the parameter struct's fields again
after each store, and ran the cell on every SIMD-group (16 lanes a unit at H = 64). Two changes
(2026-11-26): each v2 kernel's body is a template on the rows of a chunk, run with one where the
threadgroup owns one row (RgAcc<G, 1>); and at most RG_LANES = 8 lanes a unit, SIMD-groups without
a unit skipping the pass. v2's device ms, forward / backward, before → after (H200s; the numbers
before repeat within 2% from machine to machine): 50×1×64×64 RNN 0.096 / 0.110 → 0.079 / 0.090, GRU
0.172 / 0.197 → 0.128 / 0.167, LSTM 0.197 / 0.221 → 0.159 / 0.199; 1000×8×128×128 RNN 2.19 / 2.51 →
2.12 / 2.33, GRU 4.72 / 5.40 → 4.44 / 5.30, LSTM 5.05 / 7.35 → 5.00 / 7.46; 100×32×256×256
unchanged within 2%. With that v2 beats or equals v1 at H = 64 in every cell and direction (v1: RNN
0.083 / 0.088, GRU 0.146 / 0.234, LSTM 0.200 / 0.261), and the rule takes it there (:data:`V2_H`).
Then the cells' gradients take f'(a) from the f(a) they hold (``rg_derivative_at``: the LSTM's
backward evaluated four activations twice, the GRU's three) and every cell reads its parameters
before its first store (each read of p after a store was a load): in one H100 run, v2's backward at
50×1 GRU / LSTM 0.168 / 0.205 → 0.163 / 0.188 ms, at 1000×8 5.21 / 7.14 → 5.07 / 6.89, v3's at
200×64 3.65 / 4.91 → 3.59 / 4.75, the forwards within 3%. Three more were measured and left out.
Loading the cell's inputs (x' + bias, c[t−1], the next step's mask) before the product instead of
after it, meant to overlap their latency with it, made the forwards slower (1000×8 RNN 2.05 → 2.57
ms, GRU 4.12 → 4.64), and so did loading them a step ahead (the single-gate forward at 1000×8,
1.99 → 2.11 ms, one H100 call). Marking the CUDA translation's constant buffers ``__restrict__``
(read-only while a kernel runs, as Metal's are, so that the compiler loads the parameter struct's
fields once) gained v2 1–5% but spilled v1's LSTM (1000×8 backward 12.5 → 26.7 ms). The
translation now takes a kernel's ``constant T&`` as its launcher's ``__grid_constant__``
parameter by value (the harness's cuda/_build.py), read through the constant cache with no load
at all: each op's device ms, one H100 call, 1000×8 LSTM 12.62 → 11.86, 50×1 0.390 → 0.359,
100×32 3.47 → 3.43. ``rg_dots`` then takes two rounds a loop where a thread holds one row's sums
and the product has at least eight rounds (the backward's products over the gates, the forward's
at H = 256): 1000×8 LSTM backward 6.97 → 6.64 ms, 100×32 1.78 → 1.66, where with four rounds
the 1000×8 single-gate forward went 1.86 → 1.96 instead. Threadgroups of 512 or 256
(RG_THREADS) were faster still at 50×1 (LSTM forward 0.13 ms) but slower at 100×32 (0.80 against
0.52 ms, the RNN's forward) and in the backward at 1000×8, and threadgroups of 64 or 32 (a
SIMD-group or two for the row's whole step, its barriers nearly free) were slower everywhere (50×1
LSTM forward 0.15 → 0.34 / 0.58 ms, 1000×8 4.7 → 22 / 38 ms). Metal's threadgroup limit is the
kernel's, so a second size takes a second entry point: the forwards have one of 512 threads
(below).

Before the float4 reads (lanes k ≡ lane mod S, scalar loads: each load of a SIMD-group touched
four lines) v2 was slower than v1 at 11 of these 12 shapes and cells (1000×8 LSTM 10.4 / 11.5,
100×32 LSTM 4.0 / 4.3). Eight rows a threadgroup instead of one (:data:`V2_GROUP_ROWS` = 8)
took three times as long at 1000×8 (LSTM 33.8 / 25.6 ms): one core then does every row's
product. Event-timed kernel ms of the other versions, from before the float4 reads (same
H100, the CUDA launchers asking for one resident threadgroup a core, so that ptxas gives v1's
threads the registers they use), v1 against v2-steps (64 units a block) and v3 (the default
width):

- 100×32×256×256: RNN v1 1.32 / 0.68, v2-steps 3.34 / 3.21, v3 3.17 / 3.41;
  GRU 2.16 / 2.33, 4.56 / 4.34, 3.70 / 5.28; LSTM 2.40 / 2.64, 5.83 / 4.51, 3.94 / 6.37.
- 50×1×64×64: the one-step grids 0.8–1.5 ms each way.
- 200×64×512×512: RNN 5.88 / 2.93, v2-steps 5.91 / 5.50, v3 7.57 / 7.09; GRU 10.80 / 10.37,
  10.09 / 13.00, 13.93 / 16.77; LSTM 12.09 / 11.05, 15.27 / 16.37, 15.45 / 21.42.
- 1000×8×128×128: the one-step grids 20–50 ms each way.

Those times come from CUDA events around each dispatch, which also count the host's time to
launch a kernel while the GPU waits for it: about 17 µs a dispatch through metal-cuda (1000×8:
2006 dispatches in 34–38 ms). The device's own time of each kernel (torch.profiler, as cuDNN's
is measured; same H100, 2026-11-25, four runs within 2%) puts the one-step grids ahead on the
device where a step is large: at 200×64×512×512 v2-steps (64 units a block) takes 3.88 / 3.49
ms against v1's 5.87 / 2.92 (RNN), 5.77 / 8.55 against 10.77 / 10.36 (GRU), 9.20 / 10.13
against 12.13 / 11.04 (LSTM), and at 100×32×256×256 v3's forward 1.09 / 1.50 / 1.66 against
1.30 / 2.12 / 2.35. End to end they lose: with v2-steps taken by the rule at 200×64 (forward,
and the GRU's and LSTM's backward), the op's device time fell (LSTM 32.1 → 28.4 ms, GRU 28.4 →
21.7, RNN 11.5 → 9.5: 1.8× cuDNN) but one call, synchronised, took 41 / 84 / 138 ms against v1's
14 / 34 / 37 (RNN / GRU / LSTM): the GPU waits for the host between the 408 dispatches.

Two changes made the one-step grids pay (H200, 2026-11-26). The host sized a dispatch's
completion marks for threadgroups of 32 threads, so a one-step op of 408 dispatches of 1024- or
256-thread threadgroups zeroed and read back some 310 status arenas: now the marks follow the
threadgroup size the device launches with (the harness tells it). And v3's staging loaded and
stored one element at a time, each store waiting a round trip for its load (Nsight Compute:
42% of its stall samples there): now its loads are issued together and a chunk ahead, as
float4, into a k-major stage read as float4, in chunks of up to 96 k where the tile is narrow.
Device ms at 200×64×512×512, forward / backward, v3 before → after: RNN 4.68 / 4.99 → 2.23 /
2.01, GRU 10.57 / 12.73 → 4.47 / 3.65, LSTM 10.69 / 17.11 → 4.79 / 4.87 (v1: 5.78 / 2.89,
9.33 / 10.42, 11.43 / 10.70; v2-steps: 3.48 / 3.11, 4.58 / 6.25, 7.11 / 7.91). End to end the
rule with v3 from a step of 2**25 multiply-adds takes the GRU and LSTM at 200×64 there: 22.6 /
22.2 ms against 28.8 / 32.0 without, the op's device time 15.4 / 18.5 ms against 26.8 / 30.8
(1.8× / 1.9× cuDNN's; 11.9 / 14.3 ms, 1.4× / 1.5×, with v5's float4 staging, end to end
14.1 / 16.9 against 24.4 / 27.6 without v3). The single-gate RNN at 200×64 (2**24 a step) stays off it: its 408
dispatches cost the host more than they save the device (12.3 ms end to end against 11.3), and
so does the LSTM at 100×32×256×256 (2**23: 6.0 against 4.6, where v3's device time, 1.03 /
1.33, beats v2's 1.35 / 1.81). On a Mac a dispatch costs the host more than through
metal-cuda: :data:`STEPS_MIN_WORK` is the setting to measure there (``rnngrad bench``). Before the
launchers asked for one threadgroup a core, ptxas kept v1's kernels at 32–59 registers and v2
won below H = 256 (100×32 LSTM: v1 13.3, v2 8.6 ms).

v2's one-row bodies (2026-11-26, kernels/common.metal). Nsight Compute counted 312 instructions
a SIMD-group a step in v2's single-gate forward at 1000×8×128×128 for 16 multiply-adds a thread:
the chunked body's index arithmetic (divisions by N at every step), its loops over chunks,
passes and lanes, and the cell run on every SIMD-group. Where the rule's grid gives a
threadgroup one row and one pass of its threads covers every unit (S · H ≤ the threadgroup),
each v2 kernel now runs a lean body: the row's offsets computed once, the product on every
SIMD-group with its sums met in threadgroup memory and the cells run by H threads (two barriers
a step; the LSTM's forward keeps its cell on lane 0 of each unit's lanes, where it overlaps the
other SIMD-groups' products), what crosses steps (c, dh_next, dc_next, the peephole and dq sums)
in the cell thread's registers, the next step's inputs loaded a step ahead, and a single gate's
weights (H ≤ 128) and the GRU forward's (H ≤ 64) held in registers, and where they do not fit
the first two rounds of a thread's share (the single gate above H = 128, the GRU's backward:
``rg_row_dot_held``; RNN 100×32 1.07 → 1.03 ms, GRU 1000×8 6.71 → 6.52, one H100 call, after
the figures that follow; the LSTM's backward spilled with it). Each op's device ms, forward
+ gradients, before → after, each pair in one H100 call: RNN 1000×8 4.73 → 2.06, 50×1 0.225 →
0.128, 100×32 1.28 → 1.06; GRU 1000×8 9.79 → 6.76, 50×1 0.339 → 0.220, 100×32 2.77 → 2.47; LSTM
1000×8 11.66 → 8.70, 50×1 0.361 → 0.267, 100×32 3.32 → 3.04. Measured and left out: the cells
on lane 0 of every unit's lanes in all six kernels (one barrier a step, the cell's code then
run by every SIMD-group: RNN 1000×8 2.53 against 2.06, GRU 7.12 against 6.76), and on H threads
in the LSTM's forward (1000×8 forward 3.63 → 4.71 ms); the LSTM's weights held in registers at
H = 64 (spills: 50×1 backward 0.121 → 0.134 ms); four or eight rounds of float4 reads a loop
for a single sum (LSTM 1000×8 backward 4.71 → 4.75 / 5.07 ms; eight in rg_dots, GRU 1000×8
backward 4.89 → 6.74); the CUDA launcher preferring L1 to shared memory (no change in the
recurrences, GEMMs 0.39 → 0.46 ms); and reading the weights in the opposite order every other
step, so that those read last stay in L1 (LSTM 1000×8 backward 4.64 → 5.12). The step is then
bound by each core streaming all of R from L2 (256 KB for the LSTM at H = 128): a one-row
threadgroup cannot share it with another core within a dispatch.

The one-row bodies' element-wise phases (2026-11-26, later; each pair in one H100 call). With the
CUDA target's ``simd_shuffle_xor`` a butterfly shuffle and a level's shuffles of every gate
issued together (``rg_lane_totals``), the LSTM forward finishing gate k on lane k of the unit
(its four activations side by side), and the LSTM's and GRU's backwards finding the next step's
activations and derivatives while the product runs (``lstm_backward_ahead``,
``gru_backward_ahead``): GRU forward 1000×8 3.25 → 2.97 ms, 50×1 0.073 → 0.060; LSTM forward
1000×8 3.58 → 3.37, 50×1 0.085 → 0.075; LSTM backward 50×1 0.107 → 0.068, 1000×8 4.68 → 4.57;
GRU backward 50×1 0.071 → 0.052. Measured and left out: the GRU's backward finding them on the
product's threads after their product where no thread is past it (1000×8 2.87 → 3.09, 100×32
1.06 → 1.08), and the LSTM's at 100×32 where some threads take two items (1.46 → 1.52); the GRU
forward's r and z on lanes 0 and 1 before the barrier (1000×8 2.98 → 3.81: spills); the first
two rounds of the GRU forward's three rows held where all of them do not fit (1000×8 3.30 →
3.10 before the butterfly shuffle, no change after it), of the LSTM forward's four (3.63 →
4.60) and four rather than two of the GRU backward's (2.90 → 3.27); a 31 KiB stage so that
the driver gives the forwards 224 rather than 192 KB of L1 (no change; LSTM forward 1000×8
3.57 → 3.81). Every v2 kernel compiled and dispatched for 512 threads a threadgroup (128
registers a thread, no spills; S = 4 at H = 128): forward + gradients 1000×8 RNN / GRU / LSTM
2.06 / 6.00 / 8.29 → 2.78 / 6.54 / 9.10 ms, 100×32 1.02 / 2.39 / 3.05 → 1.31 / 3.37 / 4.27, but
the 50×1 forwards faster (RNN / GRU / LSTM 0.027 / 0.060 / 0.080 → 0.023 / 0.048 / 0.068: the
same S = 8, no thread idle, no spills); with, besides, the GRU forward's three rows held whole
(96 registers, some spilled) its 1000×8 forward went 2.99 → 2.50 ms, the GRU's total 6.00 →
5.66. So each forward has a second entry point, ``<cell>_forward_v2_512`` (the same body,
``max_total_threads_per_threadgroup(512)``; the GRU's holds its three rows whole where two
float4 a lane do not cover them, RG_HOLD_512), which the rule runs where H <= :data:`V2_512_H`:
every forward at H = 64 and the GRU's at 128 too. Device ms of each op, forward + gradients,
before → after, one H100 call: GRU 1000×8 5.86 → 5.41 (its forward 2.98 → 2.54), 50×1 0.177 →
0.165; LSTM 50×1 0.200 → 0.190; RNN 50×1 0.121 → 0.118; 100×32 unchanged. The single gate's and
the LSTM's forwards at H = 128 on 512 threads were slower (RNN 1000×8 forward 0.66 → 1.02 ms,
LSTM 3.38 → 3.65), and so were the backwards (GRU 1000×8 2.48 → 3.13 with Rᵀ's row held whole,
3.30 without).

Then Nsight Compute's stall samples of ``gru_forward_v2_512`` at 1000×8 (35% barrier waits behind
the cells, 29% the product's multiply-adds waiting on threadgroup reads) showed two things the
cell's thread waited on: the next step's x' + bias, added as soon as x' was loaded (the load's
latency before the barrier), and the held product reading each float4 of the stage three times,
once for each row. Now x' stays raw in registers until the cell adds the bias, and
``rg_held_dots`` reads the stage once for the three rows (bitwise the same results): GRU 1000×8
5.34 → 5.05 ms (forward 2.44 → 2.17), 50×1 0.165 → 0.152 (forward 0.048 → 0.037), 100×32
2.39 → 2.35 (one H100 call, three rounds). Measured and left out, each in one H100 call: the
backwards' one-row bodies with at most 4 lanes a unit, so that at H = 128 half the threads are
past the product and find the next step's activations ahead (GRU 1000×8 backward 2.51 → 3.72,
LSTM 4.55 → 5.49); and their products with the weight's float4 read a pair of rounds ahead of
the multiply-adds, four loads in flight rather than two (ncu: most of the backwards' stall
samples wait on those loads; GRU 1000×8 backward 2.51 → 3.29, LSTM 4.52 → 4.66: more spills at
64 registers a thread). Profiled as the bench runs it (``gpu_profile.py --as-bench``), the GRU
forward at 1000×8 then spends 41% of its stall samples in barrier waits behind the cell's 172
instructions a step on H / 32 SIMD-groups, each activation a branch on its kind. A body
compiled for sigmoid, sigmoid, tanh (the kinds constants) made the forward faster at 50×1
(0.037 → 0.032 ms) and 100×32 (0.88 → 0.83) but slower at 1000×8 (2.32 → 2.39: more spills
beside the rows held whole), one H100 call: left out; a choice per body is the next thing to try.
The cell moved onto the product's lanes instead (``gru_forward_v2_spread``: z and r on lanes 0
and 1 side by side, a_o and o on lane 2, met by simd_shuffle; one barrier a step, the stage in
two alternating buffers): the 1000×8 forward 2.13 → 1.98 ms, the op 5.03 → 4.88 (one H100
call, three rounds), but 50×1 0.037 → 0.048 and 100×32 0.88 → 0.94, so only the 512-thread
entry's rows-held-whole path runs it.

The LSTM's one-row bodies at 1000×8 then had their weight's L1 hits at 7% (forward) and 42%
(backward): R (256 KB) streamed through L1 at every step evicts what else the step reads, and
in the CUDA translation's 64 registers a thread that included values ptxas had left in local
memory and reloaded at every step, each reload then a trip to L2 on the step's critical path
(ncu: 2.3 million local-memory requests in the forward). Now the forward's body where every
thread is a unit's tests nothing per step about which (its reloads between the barrier and the
product's first load gone), the backward's is compiled without the peephole's eight registers
where there is none, and the activations both backwards find ahead lie unit-major, read at
constant offsets from one address (the no-peephole LSTM backward's loop reloads nothing, from
27 values a step; the GRU's AHEAD loop from 8). One H100 call, three rounds: LSTM 1000×8 8.26
→ 7.61 ms (forward 3.37 → 3.11, backward 4.47 → 4.07), 50×1 0.189 → 0.176, 100×32 3.04 →
2.98; GRU backward 50×1 0.052 → 0.049. Measured and left out: reversing the order of the
weight's rounds on every other step, so that the lines read last (still in L1) are read first,
raised the L1 hit rates to 34% and 51% but spilled more (LSTM 1000×8 forward 3.34 → 4.19 ms,
backward 4.53 → 4.99); and the CUDA harness asking for the largest or smallest L1 share of the
core's memory (``CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`` 0 or 100): the driver's
choice is already the largest L1 (unchanged with 0), and 100 slowed the forwards (LSTM 1000×8
forward 3.36 → 3.90 ms, GRU 2.10 → 3.74) while the LSTM's backward went 4.47 → 4.31.

The GRU's backward at 1000×8, with no reload left in its loop, was bound by L1 and threadgroup
memory (ncu: 94.5% L1 hits, 62.5% of the pipe's peak): every 128-bit read costs the pipe four
wavefronts, and a step's product read the stage once per round of the weight. Where every
thread is in the product and 2S lanes fit ``RG_LANES`` (``rg_pairs``), the single gate's and
the GRU's backward bodies now give 2S lanes two units, j and j + H / 2, reading each float4 of
the stage once for both rows (``rg_row_dots2_held``): at 100×32 (S = 4), one H100 call, three
rounds, GRU backward 1.015 → 0.802 ms (the op 2.344 → 2.129, 0.92× cuDNN's kernel time), single
gate 0.390 → 0.340 (the op 1.022 → 0.971). At 1000×8 that takes 16 lanes a pair: the GRU's
backward went 2.54 → 2.94 (the sums met over 16 lanes, more spills), so it is left out there;
the LSTM's backward paired (rg_dots of two rows) reloaded 17 values a step from local memory at
100×32 against 5, and was left out unmeasured.

The GRU at 1000×8 then took 2.5× cuDNN's kernel time, the one cell and shape above 2×. Each
backward now has a 512-thread entry point (``<cell>_backward_v2_512``, run where H is within
:data:`V2_512_BACKWARD_H`): at H = 128 that is 4 lanes a unit, so 8 lanes pair up without
16-lane butterflies, and the 128 registers a thread hold the first 4 rounds of both rows of Rᵀ
(``RG_PAIR_HOLD_512``; the single gate's rows whole), a third of the GRU's weight reads from L1
gone beside half the stage's. The GRU forward's spread body (``gru_forward_v2_spread``), whose
rows held whole in registers left none for the step's values, keeps their last round in
threadgroup memory instead: ptxas no longer spills the next step's x' as it is loaded (Nsight
Compute had 15% of the stall samples on that store, which waits for the load). One H100 call,
three rounds, device ms: GRU 1000×8 5.060 → 4.057 (forward 2.149 → 1.733, backward 2.523 →
1.936). Then, in another call, the single gate's and the LSTM's backwards on their 512-thread
entry too: RNN 1000×8 2.071 → 1.977 (backward 1.065 → 0.970), LSTM 7.633 → 6.587 (backward
4.095 → 3.059). Measured and left out: 6 and 8 rounds held (GRU 4.069 and 4.747 ms: 8
spilled) and the GRU's 512-thread backward at H = 256 (100×32 2.133 → 2.344).

The LSTM's forward at 1000×8 then streamed all of R (256 KB) through L1 at every step on its
1024-thread entry, which has no registers to spare (Nsight Compute: 22% of the stall samples
on one multiply-add waiting for its weight). Now the rule runs it on its 512-thread entry at
H = 128 too, whose threads hold the first ``RG_LSTM_HOLD_512`` = 4 float4 of their share of
each of the four rows (64 registers; rows that 2 float4 a lane cover, as at H = 64, held whole
in 2), so that a step streams half of R: one H100 call, three rounds, LSTM 1000×8 6.526 →
5.947 ms (forward 3.118 → 2.571), 50×1 0.175 → 0.167 with the rows whole in 2 float4
(forward 0.064 → 0.056; 0.061 in 4), 100×32 unchanged (H = 256 stays on 1024 threads). With 2
rounds held at H = 128 the forward took 3.096; with 5 or more ptxas spills and reloads 23 or
more values a step.

Not measured on Apple hardware, where
Apple's compiler, not ptxas, allots the registers: set :data:`V2_H` and
:data:`V2_MAX_ROWS` from ``rnngrad bench`` there. Override it with
``RNNGRAD_METAL_RECURRENCE`` = ``v2`` | ``v2-steps`` | ``v3`` | ``v1`` | ``packed`` | ``rows`` |
``auto`` (``v1``: v1 in the grid its rule picks) or the module setting :data:`RECURRENCE`;
:data:`V2_GROUP_ROWS` sets v2's rows per threadgroup. The two grids of v1 give bitwise the same
results (only the rows' assignment to threadgroups changes); v2 and v3 sum in other orders,
within the float32 tolerance.

The matrix products outside the recurrence have five versions
(``kernels/gemm.metal``; shapes as ``GemmParams`` in ``kernels/common.metal``: C[batch, M, P] =
A·B over K):

- ``v1`` ``strided_gemm``: one thread per element of C, each a loop over K.
- ``v2`` ``strided_gemm_tiled``: one threadgroup of up to :data:`THREADS` threads per
  :data:`TILE`×:data:`TILE` tile of C, K staged through threadgroup memory in chunks of
  :data:`TILE`, multiplied with ``simdgroup_matrix`` 8×8 tiles.
- ``v3`` ``strided_gemm_blocked``: one threadgroup of up to :data:`BLOCKED_THREADS` threads per
  :data:`BLOCKED_TILE`×:data:`BLOCKED_TILE` tile of C, K staged through threadgroup memory in
  chunks of 32, each thread a 4×4 block of C in registers (no ``simdgroup_matrix``).
- ``v4`` ``strided_gemm_split``: one threadgroup of up to :data:`SPLIT_THREADS` threads per
  :data:`SPLIT_COLUMNS` elements of a row of C, K split into a slice per SIMD-group, the
  slices' sums added in order through threadgroup memory (for few elements over a long K).
- ``v5`` ``strided_gemm_wide``: one threadgroup of up to :data:`WIDE_THREADS` threads per
  :data:`WIDE_TILE`×:data:`WIDE_TILE` tile of C and slice of K, each thread an 8×8 block of C
  in registers read as float4 from two staged buffers of :data:`WIDE_K` k (the next chunk's
  loads in flight while one is multiplied). Where C has too few tiles for the cores and no
  bias, K splits into slices (:func:`wide_slices`), each stored apart, and a v1 product over
  the slices adds them in order (``MetalHost.gemm``: two dispatches).

The rule (``auto``): **a tiled version when M, P and K are each at least 8, batch·M·P·K is at
least** :data:`TILED_MIN_WORK` **(2**20 multiply-adds) and C has at least**
:data:`TILED_MIN_TILES` **32×32 tiles: v5 where its tiles × slices of K make at least**
:data:`WIDE_MIN_GROUPS` **threadgroups, else** :data:`TILED_VERSION` **(v3); with fewer tiles,
v4 when C has fewer than** :data:`SPLIT_MAX_ELEMENTS` **elements and K is at least**
:data:`SPLIT_MIN_K`**, else v5 over slices of K where it splits (no bias, K of at least
2·**:data:`WIDE_MIN_SLICE`**), else v1.** Measured on the H100 (device time, torch.profiler),
GEMM ms of a whole op, the previous rule (v3, v4, v1) → this one: 100×32×256×256 RNN 0.70 →
0.40, GRU 1.48 → 0.67, LSTM 1.50 → 0.68; 200×64×512×512 RNN 7.72 → 2.69, GRU 10.12 → 7.36,
LSTM 11.45 → 9.05; 1000×8×128×128 GRU 1.95 → 0.58, LSTM 1.99 → 0.62 (its dR and dW over K =
8000, 64 32×32 tiles, ran on v1: now v5 over 15 slices), RNN 0.35 (v3, v4: unchanged); every
product forced to v5: 0.57 / 0.94 / 1.14, 2.93 / 8.01 / 10.11, 0.50 / 0.71 / 0.75 (v5 is
slower than v3 on few tiles and than v4 on one-row reductions). Under Nsight Compute v5's input
projection at 200×64 issues at 45% of the cores' peak with one threadgroup of 8 warps a core
(228 registers a thread): latency, not the FLOP rate, bounds it; staging each chunk as one
float4 of each operand a thread (``gw_load4``, where the strides allow) halved v5's GEMM time
by the rule on an H200 (2026-11-26: 200×64 LSTM 9.06 → 4.72 ms, GRU 7.34 → 3.85, RNN 2.73 →
1.56; 100×32 LSTM 0.74 → 0.46). Below
8 in M or P a tile is mostly padding: the 1-row reductions (bias, peephole and secondary-bias
gradients, M = 1) are untiled. Below 8 in K the staged chunk is mostly zeros. Below 2**20 multiply-adds the
dispatch costs more than the product either way, and v1 makes fewer threads wait on barriers.
With fewer tiles than the GPU has cores the few threadgroups each walk a long K alone, where
v1's thousands of threads hide the latency better: measured on an H100 through metal-cuda
(132 cores), the weight gradients of 1000×8×128×128 (C of 64 tiles, K = 8000) took 2.9 ms of
GEMMs with v1 and 3.7–4.4 ms with v2, while at 200×64×512×512 v2 halved them (LSTM 39.9 → 19.4
ms, GRU 30.5 → 17.0 ms). The thresholds are measured on that GPU only, not on Apple hardware.
v1 gives a C of P elements one thread each, so a bias gradient over T·N rows ran on two to four
threadgroups: 1.65 ms of 200×64×512×512 LSTM's GEMMs under Nsight Compute
(``verification/gpu_profile.py``). v4 spreads each element's sum over 8 SIMD-groups: GEMM ms
of a whole op by the rule, v1 → v4 for the untiled products of fewer than 32768 elements, same
H100: 200×64×512×512 RNN 9.85 → 7.74, GRU 12.36 → 10.18, LSTM 13.69 → 11.48; 1000×8×128×128
RNN 2.09 → 0.39 (its dR and dW too: C of 16384 elements over K = 8000), GRU 2.47 → 2.01, LSTM
2.59 → 2.05; 100×32×256×256 LSTM 1.77 → 1.55. Then 32 SIMD-groups a threadgroup instead of 8
(1024 threads, each slice a quarter as long; 2026-11-27, ``gpu_ab.py``, least of two rounds,
the rule's GEMM ms of a whole op, 8 → 32 slices): 1000×8×128×128 RNN / GRU / LSTM 0.352 / 0.388
/ 0.427 → 0.296 / 0.350 / 0.367; 200×64×512×512 1.417 / 3.587 / 4.444 → 1.280 / 3.447 / 4.307;
100×32×256×256 0.288 / 0.460 / 0.398 → 0.272 / 0.442 / 0.375.

The tiled version the rule uses is v3: GEMM ms of a whole op, every product forced to v2 → v3
on the H100: 100×32×256×256 RNN 1.78 → 1.68, GRU 2.17 → 1.95, LSTM 2.29 → 1.97;
200×64×512×512 RNN 11.1 → 9.7, GRU 16.8 → 12.0, LSTM 19.0 → 13.0. The tile count of the rule
is counted in 32×32 tiles whichever version tiles (an area of C).

Override it with the environment variable ``RNNGRAD_METAL_GEMM`` = ``v1`` | ``v2`` | ``v3`` |
``v4`` | ``auto`` (read at every product) or the module setting :data:`GEMM` (``versions.GEMM = "v2"``;
``None`` defers to the variable), which wins over the variable; :func:`forced` sets it inside a block.
Every version computes every shape (any strides, batch, GRU's ``block``/``b_block``) within
the float32 tolerance.

The choice is visible: :func:`gemm` returns a :class:`Choice` (version, kernel, reason) for a
shape, the dispatch runs that kernel (the harness's ``Device.trace`` names it, as do
:class:`~rnngrad.backends.metal.IncompleteDispatch` messages), and the host logs each choice at
DEBUG level on the logger ``rnngrad.backends.metal``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import os

from ...descriptors import DESCRIPTORS

#: environment variable that overrides the rule: v1, v2, v3, v4, v5 or auto
GEMM_ENV = "RNNGRAD_METAL_GEMM"
#: module setting that overrides the rule and the variable: "v1", "v2", "v3", "v4", "v5", "auto" or
#: None
GEMM = None
#: the versions of the matrix product: version -> kernel
GEMM_KERNELS = {"v1": "strided_gemm", "v2": "strided_gemm_tiled", "v3": "strided_gemm_blocked",
                "v4": "strided_gemm_split", "v5": "strided_gemm_wide"}
#: rows and columns of a v2 tile of C, and k per staged chunk (GT_TILE in gemm.metal)
TILE = 32
#: threads the host dispatches per v2 tile: the kernel's threadgroup limit (GT_THREADS)
THREADS = 128
#: rows and columns of a v3 tile of C (GB_TILE in gemm.metal)
BLOCKED_TILE = 64
#: threads the host dispatches per v3 tile: one per 4×4 block of C, the kernel's threadgroup
#: limit (GB_THREADS)
BLOCKED_THREADS = 256
#: rows and columns of a v5 tile of C (GW_TILE in gemm.metal), k per staged chunk (GW_K)
WIDE_TILE = 128
WIDE_K = 8
#: threads the host dispatches per v5 tile and slice of K: one per 8×8 block of C (GW_THREADS)
WIDE_THREADS = 256
#: v5 splits K into slices where C has fewer tiles than this (about two threadgroups a core of
#: a large GPU), for products without a bias, into at most K / WIDE_MIN_SLICE slices
WIDE_SPLIT_TILES = 264
WIDE_MIN_SLICE = 512
#: the rule takes v5 for a tiled product when it gives at least this many threadgroups (tiles
#: × slices of K; about half the cores of a large GPU), else :data:`TILED_VERSION`
WIDE_MIN_GROUPS = 64
#: version -> (tile side, threads per tile) of the tiled versions
TILED = {"v2": (TILE, THREADS), "v3": (BLOCKED_TILE, BLOCKED_THREADS),
         "v5": (WIDE_TILE, WIDE_THREADS)}
#: the tiled version the rule (auto) picks for large products: "v2" or "v3"
TILED_VERSION = "v3"
#: the smallest batch·M·P·K that the rule gives to v2
TILED_MIN_WORK = 2 ** 20
#: the smallest M, P and K that the rule gives to v2: one 8×8 simdgroup_matrix
TILED_MIN_SIDE = 8
#: the fewest 32×32 tiles of C that the rule tiles (about one per core of a large GPU)
TILED_MIN_TILES = 128

#: columns of C per v4 block (GS_COLS in gemm.metal) and threads the host dispatches per block
#: (GS_THREADS: 32 slices of K)
SPLIT_COLUMNS = 32
SPLIT_THREADS = 1024
#: v4 where v1 would run with fewer than this many threads (too few threadgroups for the
#: cores) over a K of at least SPLIT_MIN_K
SPLIT_MAX_ELEMENTS = 32768
SPLIT_MIN_K = 256
_SETTINGS = ("v1", "v2", "v3", "v4", "v5", "auto")

#: environment variable that overrides the recurrences' version: v2, v2-steps, v1, packed, rows
#: or auto
RECURRENCE_ENV = "RNNGRAD_METAL_RECURRENCE"
#: module setting that overrides the rule and the variable: "v2", "v2-steps", "v1", "packed",
#: "rows", "auto" or None ("v1": v1 in the grid the rule picks for it)
RECURRENCE = None
#: the largest H the rule gives one threadgroup per row
ROWS_MAX_H = 512
#: below this many packed threadgroups the rule spreads the rows (about the cores of a GPU)
ROWS_MIN_GROUPS = 128
#: rows per chunk of a v2 recurrence at most (RG_BMAX in common.metal)
V2_ROWS = 8
#: floats of threadgroup memory a v2 recurrence stages (RG_STAGE in common.metal)
V2_STAGE = 6144
#: floats a v2 kernel stages per row of a chunk, in units of H
V2_STAGE_PER_ROW = {("single_gate", "forward"): 1, ("single_gate", "backward"): 1,
                    ("gru", "forward"): 2, ("gru", "backward"): 4,
                    ("lstm", "forward"): 1, ("lstm", "backward"): 4}
#: threads the host asks for per v2 threadgroup (metalcompute's largest threadgroup)
V2_THREADS = 1024
#: threads the host asks for per threadgroup of a forward's second v2 entry point
#: (``<cell>_forward_v2_512``: the same body, compiled for threadgroups of at most 512)
V2_THREADS_512 = 512
#: the largest H at which a v2 forward runs on its 512-thread entry point, by cell (measured:
#: every forward at H = 64, the GRU's at 128 with its three weight rows held whole and the
#: LSTM's with half of its four (RG_LSTM_HOLD_512); slower at 256, and the single gate's at
#: 128); None: never
V2_512_H = {"single_gate": 64, "gru": 128, "lstm": 128}
#: the H at which a v2 backward runs on its 512-thread entry point (``<cell>_backward_v2_512``),
#: by cell: (smallest, largest), or absent (never). At H = 128 its 4 lanes a unit pair up, 8
#: lanes owning two units with part of both rows of Rᵀ held in registers (RG_PAIR_HOLD_512)
V2_512_BACKWARD_H = {"single_gate": (128, 128), "gru": (128, 128), "lstm": (128, 128)}
#: rows per v2 threadgroup the host asks for (the kernels take more in chunks of V2_ROWS)
V2_GROUP_ROWS = 1
#: the H the rule gives v2, by cell and direction: (smallest, largest), or None (never); each
#: row's threadgroup reads all of R every step. Measured wins (module docstring): every cell
#: and direction at H = 64, 128 and 256 (the single-gate backward even with v1 at 64 and 128),
#: the single-gate forward at 512 too; v1 at 512 elsewhere
V2_H = {("single_gate", "forward"): (64, 512), ("single_gate", "backward"): (64, 256),
        ("gru", "forward"): (64, 256), ("gru", "backward"): (64, 256),
        ("lstm", "forward"): (64, 256), ("lstm", "backward"): (64, 256)}
#: the most rows (D·N) the rule gives v2 a threadgroup each (measured: 8 and 32)
V2_MAX_ROWS = 64
#: units per threadgroup at most in v2's one-step grid (v2-steps): H splits into
#: ⌈H / V2_STEP_UNITS⌉ blocks, so that at most 1024 / V2_STEP_UNITS lanes share a unit's sum
V2_STEP_UNITS = 64
#: the rule runs v3 (one dispatch a step) where a step's recurrent product has at least this
#: many multiply-adds (D·N·G·H²): where the device time it saves outweighs what its dispatches
#: cost the host (the module docstring says why); None: never
STEPS_MIN_WORK = 2 ** 25
#: rows per threadgroup in v2's one-step grid; None: a whole chunk (each R element loaded serves
#: every row of it)
V2_STEP_ROWS = None
#: threads the host asks for per v3 tile (RS threadgroups in common.metal: the kernels' limit)
V3_THREADS = 256
#: rows of a v3 tile at most (RS_ROWS), and columns (RS_COLS): units × gates forward for the
#: LSTM and GRU (4 columns a unit), units elsewhere
V3_ROWS = 16
V3_COLS = 64
#: the fewest v3 tiles the host aims for (about one per core of a large GPU): it takes the
#: widest block of units (a power of two) that still gives this many, else the narrowest
V3_MIN_TILES = 128
_GRIDS = ("v2", "v2-steps", "v3", "v1", "packed", "rows", "auto")


def tile_columns(*, cell: str, direction: str) -> int:
    """Columns of a v3 tile a unit: its gates in the forward of the LSTM and the GRU, else 1."""
    return 4 if direction == "forward" and cell in ("lstm", "gru") else 1


def tile_rows(N: int) -> int:
    """Rows of a v3 tile: 4·⌈N / 4⌉, at most :data:`V3_ROWS` (rs_tile's 4·WR in common.metal)."""
    return 4 * min(V3_ROWS // 4, max(1, -(-N // 4)))


def tile_blocks(*, cell: str, direction: str, D: int, N: int, H: int) -> tuple:
    """(row tiles of a direction, unit blocks U) of v3's grid: tiles of :func:`tile_rows` rows
    × ⌈H / U⌉ units, with the widest power-of-two block of units within :data:`V3_COLS`
    columns that gives at least :data:`V3_MIN_TILES` tiles (else the narrowest: 4 columns)."""
    cpu = tile_columns(cell=cell, direction=direction)
    row_tiles = -(-max(N, 1) // tile_rows(N))
    width = V3_COLS // cpu
    narrowest = max(1, 4 // cpu)
    while width > narrowest and D * row_tiles * -(-H // width) < V3_MIN_TILES:
        width //= 2
    return row_tiles, max(1, -(-H // width))


def v2_rows(*, cell: str, direction: str, H: int) -> int:
    """Rows of one v2 chunk: min(RG_BMAX, RG_STAGE / floats staged per row); 0 where one row
    does not fit (then v2 cannot run)."""
    return min(V2_ROWS, V2_STAGE // (V2_STAGE_PER_ROW[(cell, direction)] * max(H, 1)))


def group_rows(*, cell: str, direction: str, H: int) -> int:
    """Rows per v2 threadgroup the host asks for: :data:`V2_GROUP_ROWS`, at most a chunk."""
    return max(1, min(V2_GROUP_ROWS, v2_rows(cell=cell, direction=direction, H=H)))


def step_blocks(*, cell: str, direction: str, H: int) -> tuple:
    """(rows per threadgroup, unit blocks U) of v2's one-step grid: :data:`V2_STEP_ROWS` rows
    (default a whole chunk) and ⌈H / :data:`V2_STEP_UNITS`⌉ blocks of units."""
    chunk = max(1, v2_rows(cell=cell, direction=direction, H=H))
    rows = chunk if V2_STEP_ROWS is None else max(1, min(int(V2_STEP_ROWS), chunk))
    return rows, max(1, -(-H // max(int(V2_STEP_UNITS), 1)))


def recurrence(*, cell: str, direction: str, D: int, N: int, H: int, device: str = "",
               reset_after: bool = True) -> Choice:
    """The version of a recurrence dispatch (``<cell>_<direction>``, direction "forward" or
    "backward") and why: ``Choice.version`` is "v2", "v2-steps" (v2 one step a dispatch, its
    threadgroups over rows and blocks of units: :func:`step_blocks`), "v3" (one step a
    dispatch, tiles of rows × units: :func:`tile_blocks`), or "packed" / "rows" (v1 in one of
    its two grids); ``Choice.kernel`` the kernel; its thread count is
    :func:`recurrence_count`. ``device`` is the backend's name: on the CPU harness
    ("metal-emulated") v1 always packs. ``reset_after``: the GRU's (without it a GRU step
    needs r of every unit before its o gate, so the one-step grids do not apply; the rule's v2
    was measured with it only)."""
    setting, source = _setting(RECURRENCE, "RECURRENCE", RECURRENCE_ENV, _GRIDS)
    v1, v2 = f"{cell}_{direction}", f"{cell}_{direction}_v2"
    shape = f"{v1}, D={D}, N={N}, H={H}"
    fits = v2_rows(cell=cell, direction=direction, H=H) >= 1
    if setting in ("v2", "v2-steps") and not fits:
        raise ValueError(f"{source}={setting}: {shape}: one row stages "
                         f"{V2_STAGE_PER_ROW[(cell, direction)]}·H = "
                         f"{V2_STAGE_PER_ROW[(cell, direction)] * H} floats, more than the "
                         f"{V2_STAGE} of threadgroup memory v2 has; use packed or rows")
    if setting in ("v2-steps", "v3"):  # the one-step grids
        if cell != "gru" or reset_after:
            if setting == "v2-steps":
                rows, blocks = step_blocks(cell=cell, direction=direction, H=H)
                return Choice("v2-steps", v2, f"{shape}: forced by {source}=v2-steps: one "
                                              f"dispatch a step, threadgroups of {rows} row(s) "
                                              f"× {blocks} block(s) of units")
            row_tiles, blocks = tile_blocks(cell=cell, direction=direction, D=D, N=N, H=H)
            return Choice("v3", f"{v1}_v3", f"{shape}: forced by {source}=v3: one dispatch a "
                                            f"step, {D * row_tiles * blocks} tile(s) of "
                                            f"{tile_rows(N)} row(s) × {-(-H // blocks)} unit(s)")
        why = (f"a GRU without reset_after needs {'r' if direction == 'forward' else 'da_o'} "
               f"of every unit within a step")
        shape = f"{shape}: {source}={setting}, but {why}, so the rule"
        setting = "auto"
    if setting == "v2":
        kernel, entry = _v2_entry(cell=cell, direction=direction, H=H)
        return Choice("v2", kernel, f"{shape}: forced by {source}=v2{entry}")
    if setting not in ("auto", "v1"):
        return Choice(setting, v1, f"{shape}: forced by {source}={setting}")
    packed_groups = -(-D * N * H // 1024)
    if setting == "v1":
        shape = f"{shape}: v1 forced by {source}=v1, its grid"
    if device == "metal-emulated":
        return Choice("packed", v1, f"{shape}: auto, v1 packed on the CPU harness, which runs "
                                    f"every GPU thread as a fiber: idle threads cost there what "
                                    f"they save on a GPU")
    work = D * N * DESCRIPTORS[cell].gates * H * H
    if (setting == "auto" and STEPS_MIN_WORK is not None and work >= STEPS_MIN_WORK
            and (cell != "gru" or reset_after)):
        row_tiles, blocks = tile_blocks(cell=cell, direction=direction, D=D, N=N, H=H)
        return Choice("v3", f"{v1}_v3", f"{shape}: auto, v3: a step's product is D·N·G·H² = "
                                        f"{work} >= {STEPS_MIN_WORK} multiply-adds, one dispatch "
                                        f"a step, {D * row_tiles * blocks} tile(s) of "
                                        f"{tile_rows(N)} row(s) × {-(-H // blocks)} unit(s)")
    low, high = V2_H.get((cell, direction)) or (1, 0)
    if (setting == "auto" and fits and low <= H <= high and D * N <= V2_MAX_ROWS
            and (cell != "gru" or reset_after)):
        kernel, entry = _v2_entry(cell=cell, direction=direction, H=H)
        return Choice("v2", kernel, f"{shape}: auto, v2: {low} <= H <= {high} and D·N = {D * N} "
                                    f"<= {V2_MAX_ROWS}, "
                                    f"{group_rows(cell=cell, direction=direction, H=H)} row(s) a "
                                    f"threadgroup{entry}")
    if H <= ROWS_MAX_H and packed_groups < ROWS_MIN_GROUPS and D * N > packed_groups:
        return Choice("rows", v1, f"{shape}: auto, v1, H <= {ROWS_MAX_H} and packing leaves "
                                  f"{packed_groups} threadgroup(s) for {D * N} rows: one per row")
    return Choice("packed", v1, f"{shape}: auto, v1 packed: {packed_groups} threadgroup(s)")


def _v2_entry(*, cell: str, direction: str, H: int) -> tuple:
    """(kernel, a clause for the reason) of v2's entry point: the 512-thread one
    (``<cell>_<direction>_v2_512``) of a forward where H <= :data:`V2_512_H` and of a backward
    within :data:`V2_512_BACKWARD_H`, else ``<cell>_<direction>_v2``."""
    if direction == "forward":
        largest = (V2_512_H or {}).get(cell)
        if largest is not None and H <= largest:
            return (f"{cell}_{direction}_v2_512",
                    f", threadgroups of {V2_THREADS_512} (H = {H} <= {largest}: V2_512_H)")
    else:
        low, high = (V2_512_BACKWARD_H or {}).get(cell) or (1, 0)
        if low <= H <= high:
            return (f"{cell}_{direction}_v2_512",
                    f", threadgroups of {V2_THREADS_512} ({low} <= H = {H} <= {high}: "
                    f"V2_512_BACKWARD_H)")
    return f"{cell}_{direction}_v2", ""


def v2_threads(kernel: str) -> int:
    """Threads a v2 threadgroup of ``kernel`` asks for: :data:`V2_THREADS_512` for the 512-thread
    entry points, else :data:`V2_THREADS`."""
    return V2_THREADS_512 if kernel.endswith("_v2_512") else V2_THREADS


def recurrence_count(choice: Choice, *, cell: str, direction: str, D: int, N: int,
                     H: int) -> int:
    """The threads a recurrence dispatch asks for under ``choice``: v2 one threadgroup of
    :func:`v2_threads` per :func:`group_rows` rows, v2-steps one of :data:`V2_THREADS` per
    block of units of each :func:`step_blocks` rows, v1 ``rows`` one per row, v1 ``packed`` one
    thread per (row, unit)."""
    if choice.version == "v2":
        groups = -(-D * N // group_rows(cell=cell, direction=direction, H=H))
        return groups * v2_threads(choice.kernel)
    if choice.version == "v2-steps":
        rows, blocks = step_blocks(cell=cell, direction=direction, H=H)
        return -(-D * N // rows) * blocks * V2_THREADS
    if choice.version == "v3":
        row_tiles, blocks = tile_blocks(cell=cell, direction=direction, D=D, N=N, H=H)
        return D * row_tiles * blocks * V3_THREADS
    return D * N * (1024 if choice.version == "rows" else H)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The version that runs one dispatch: ``version`` ("v1" to "v5" for a product, or a
    recurrence's version or grid), ``kernel`` (its name in ``kernels/``) and ``reason`` (a
    sentence)."""
    version: str
    kernel: str
    reason: str

    def __str__(self):
        return f"{self.version} {self.kernel}: {self.reason}"


def _setting(value, attribute: str, env: str, choices) -> tuple:
    """(setting, where it came from): the module setting ``value`` (this module's
    ``attribute``) unless it is None, else ``$env``, else auto; a ValueError naming where it
    came from when it is not one of ``choices``."""
    if value is not None:
        source = f"rnngrad.backends.metal.versions.{attribute}"
    else:
        value, source = os.environ.get(env, "").strip() or "auto", env
    setting = str(value).strip().lower()
    if setting not in choices:
        raise ValueError(f"{source}: expected one of {', '.join(choices)}, got {value!r}")
    return setting, source


def gemm_setting() -> tuple:
    """(setting, where it came from): :data:`GEMM`, else ``$RNNGRAD_METAL_GEMM``, else auto."""
    return _setting(GEMM, "GEMM", GEMM_ENV, _SETTINGS)


def gemm(*, batch: int, M: int, P: int, K: int, product: str = "", has_bias: bool = False,
         block: int | None = None, b_block: int = 0) -> Choice:
    """The version that runs C[batch, M, P] = A·B over K (``has_bias``: + bias; ``block``,
    ``b_block``: GRU's row blocks, as GemmParams), and why. ``product`` names it in the reason
    (for example "input weight gradient")."""
    setting, source = gemm_setting()
    shape = f"batch={batch}, M={M}, P={P}, K={K}"
    what = f"{product} ({shape})" if product else shape
    if setting != "auto":
        return Choice(setting, GEMM_KERNELS[setting], f"{what}: forced by {source}={setting}")
    tiled = TILED_VERSION
    if tiled not in TILED:
        raise ValueError(f"rnngrad.backends.metal.versions.TILED_VERSION: expected one of "
                         f"{', '.join(TILED)}, got {tiled!r}")
    tile = TILED[tiled][0]
    work = batch * M * P * K
    side = min(M, P, K)
    if side < TILED_MIN_SIDE:
        name = "M" if M == side else ("P" if P == side else "K")
        kind = " (a reduction to one row)" if M == 1 else ""
        why = (f"{name}={side} < {TILED_MIN_SIDE}{kind}: a {tile}x{tile} tile would be mostly "
               f"padding")
        return _untiled(f"{what}: auto, {why}", batch * M * P, K)
    if work < TILED_MIN_WORK:
        return _untiled(f"{what}: auto, batch·M·P·K = {work} < {TILED_MIN_WORK}: too small to "
                        f"tile", batch * M * P, K)
    tiles = batch * -(-M // TILE) * -(-P // TILE)
    rows = dict(batch=batch, M=M, P=P, block=block or max(M, 1), b_block=b_block)
    wide = gemm_tiles(**rows, tile=WIDE_TILE)
    slices = wide_slices(**rows, K=K, has_bias=has_bias)[0]
    split = f" over {slices} slices of K" if slices > 1 else ""
    if tiles < TILED_MIN_TILES:
        why = (f"{what}: auto, {tiles} 32x32 tiles of C < {TILED_MIN_TILES}: too few "
               f"threadgroups for a K of {K}")
        if slices > 1 and not _splits_rows(batch * M * P, K):
            return Choice("v5", GEMM_KERNELS["v5"], f"{why}; v5: {wide} 128x128 tile(s){split}")
        return _untiled(why, batch * M * P, K)
    reason = (f"{what}: auto, batch·M·P·K = {work} >= {TILED_MIN_WORK}, M, P, K >= "
              f"{TILED_MIN_SIDE} and {tiles} 32x32 tiles: tiled")
    if wide * slices >= WIDE_MIN_GROUPS:
        return Choice("v5", GEMM_KERNELS["v5"], f"{reason}, v5: {wide} 128x128 tile(s){split}, "
                                                f"{wide * slices} threadgroups >= {WIDE_MIN_GROUPS}")
    return Choice(tiled, GEMM_KERNELS[tiled], f"{reason}, {tiled}: {wide * slices} 128x128 "
                                              f"threadgroup(s) < {WIDE_MIN_GROUPS}")


def _splits_rows(elements: int, K: int) -> bool:
    """Whether v4 takes an untiled product of ``elements`` elements over ``K``: fewer than
    :data:`SPLIT_MAX_ELEMENTS` (where v1's thread an element would leave most cores idle) over
    a K of at least :data:`SPLIT_MIN_K`."""
    return elements < SPLIT_MAX_ELEMENTS and K >= SPLIT_MIN_K


def _untiled(reason: str, elements: int, K: int) -> Choice:
    """An untiled product: v4 where :func:`_splits_rows`, else v1."""
    if _splits_rows(elements, K):
        return Choice("v4", GEMM_KERNELS["v4"],
                      f"{reason}; {elements} element(s) < {SPLIT_MAX_ELEMENTS} over K = {K} >= "
                      f"{SPLIT_MIN_K}: v4, K split over {SPLIT_THREADS // SPLIT_COLUMNS} slices")
    return Choice("v1", GEMM_KERNELS["v1"], reason)


def gemm_tiles(*, batch: int, M: int, P: int, block: int, b_block: int, tile: int = TILE) -> int:
    """The ``tile``×``tile`` tiles of C[batch, M, P] (:data:`TILE` for v2, :data:`BLOCKED_TILE`
    for v3). With ``b_block`` != 0 the rows of C come in blocks of ``block`` that read different
    parts of B, and no tile straddles two (strided_gemm_tiled and strided_gemm_blocked count
    them the same way)."""
    span = max(block, 1) if b_block else max(M, 1)
    blocks = -(-M // span)
    return batch * blocks * -(-span // tile) * -(-P // tile)


def wide_slices(*, batch: int, M: int, P: int, K: int, block: int, b_block: int,
                has_bias: bool) -> tuple:
    """(slices, k per slice) of a v5 product: one slice (k per slice 0) unless C has fewer than
    :data:`WIDE_SPLIT_TILES` tiles and no bias; then enough slices for that many threadgroups,
    each at least :data:`WIDE_MIN_SLICE` k (a multiple of :data:`WIDE_K`)."""
    tiles = gemm_tiles(batch=batch, M=M, P=P, block=block, b_block=b_block, tile=WIDE_TILE)
    if has_bias or tiles >= WIDE_SPLIT_TILES:
        return 1, 0
    slices = min(-(-WIDE_SPLIT_TILES // max(tiles, 1)), K // WIDE_MIN_SLICE)
    if slices < 2:
        return 1, 0
    k_split = -(-K // slices)
    k_split = -(-k_split // WIDE_K) * WIDE_K
    return -(-K // k_split), k_split


def gemm_threads(choice: Choice, *, batch: int, M: int, P: int, block: int, b_block: int,
                 slices: int = 1) -> int:
    """The threads to dispatch for ``choice``: one per element of C for v1, :data:`THREADS`
    per 32×32 tile for v2, :data:`BLOCKED_THREADS` per 64×64 tile for v3,
    :data:`SPLIT_THREADS` per :data:`SPLIT_COLUMNS` elements of a row for v4,
    :data:`WIDE_THREADS` per 128×128 tile and slice of K for v5 (each kernel splits its work
    over the threadgroups it gets)."""
    if choice.version == "v1":
        return batch * M * P
    if choice.version == "v4":
        return batch * M * -(-P // SPLIT_COLUMNS) * SPLIT_THREADS
    tile, threads = TILED[choice.version]
    tiles = gemm_tiles(batch=batch, M=M, P=P, block=block, b_block=b_block, tile=tile)
    return threads * tiles * (slices if choice.version == "v5" else 1)


@contextlib.contextmanager
def forced(version: str | None):
    """Set :data:`GEMM` to ``version`` inside the block (``with versions.forced("v2"): ...``)."""
    global GEMM
    if version is not None and str(version).strip().lower() not in _SETTINGS:
        raise ValueError(f"forced: expected one of {', '.join(_SETTINGS)} or None, "
                         f"got {version!r}")
    previous, GEMM = GEMM, version
    try:
        yield
    finally:
        GEMM = previous


#: every setting of this module the rules read (its upper-case names that are not functions),
#: named once for :func:`settings`
_KNOBS = tuple(name for name, value in list(globals().items())
               if name.isupper() and not callable(value) and not name.startswith("_"))
#: the settings' values in _KNOBS' order, from the module's namespace: one call
_KNOB_VALUES = operator.itemgetter(*_KNOBS)


def settings() -> tuple:
    """Everything the version rules read besides the sizes, as one value: the two environment
    variables and this module's settings (every upper-case name: the rules' constants,
    :data:`GEMM`, :data:`RECURRENCE`, the ``V2_H`` table...; a dict as its items). The host
    keeps an op's plan per value (rnngrad.backends.metal.plan), so that changing any of them (as
    tests and the bench do) takes effect on the next call. It is hashable as long as every
    setting is; where one is not (a list), the host keys the plan by its repr
    (``MetalHost.plan``)."""
    values = _KNOB_VALUES(globals())
    if dict in map(type, values):
        values = tuple([tuple(value.items()) if type(value) is dict else value
                        for value in values])
    return os.environ.get(GEMM_ENV), os.environ.get(RECURRENCE_ENV), values
