# zsock_bench pingpong: the layout of the AZ-SDP paper's fig. 6a. Redraw with: gnuplot pingpong.gp
set terminal pngcairo size 560,440 enhanced font ",10"
set output "pingpong.png"
set grid
set key top left
set logscale x 2
set xlabel "message size (bytes)"
set xtics ("8" 8, "64" 64, "1K" 1024, "4K" 4096, "64K" 65536, "1M" 1.04858e+06)
set xrange [5.714285714:1468006.4]
set logscale y 10
set ylabel "one-way latency, p50 (us)"
set title "Ping-pong latency (the AZ-SDP paper's fig. 6a)" noenhanced
plot "pingpong.dat" index 0 using 1:2 with linespoints lw 2 title "unet bcopy" noenhanced, \
     "pingpong.dat" index 1 using 1:2 with linespoints lw 2 title "unet zcopy" noenhanced, \
     "pingpong.dat" index 2 using 1:2 with linespoints lw 2 title "unet azcopy" noenhanced, \
     "pingpong.dat" index 3 using 1:2 with linespoints lw 2 title "kernel TCP" noenhanced, \
     "pingpong.dat" index 4 using 1:2 with linespoints lw 2 title "kernel TCP busy-polled" noenhanced
